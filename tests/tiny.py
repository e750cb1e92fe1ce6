"""The tiny Llama every engine-level test builds (seeded, built locally, milliseconds a step)."""

from __future__ import annotations

from kvtier.engine import ModelSize

TINY = ModelSize(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=1024,
)
