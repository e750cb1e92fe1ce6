"""Small seeded models of today's hybrid architectures, built locally for vLLM's CPU build.

Each is a transformers config with random weights drawn from one seed (nothing is
downloaded), sized so vLLM's CPU build runs it in seconds: head size 32 (vLLM's CPU
attention needs at least 32), a 64-token window or attention chunk (two 32-token vLLM
blocks), a few layers. What vLLM makes of each (its KV cache groups, as
``vllm_hybrid_engine.py`` reports them):

==============  ================================================  =======================
architecture    layers                                            vLLM's KV cache groups
==============  ================================================  =======================
``gemma2``      Gemma 2: sliding, full, sliding, full             2: sliding, full
``gemma3``      Gemma 3: 5 sliding, 1 full                        6: 5 sliding, 1 full
``gpt_oss``     gpt-oss: sliding (with sinks), full; MoE          2: sliding, full
``mistral``     Mistral: every layer the same sliding window      1: sliding
``llama4``      Llama 4: 3 chunked local attention, 1 full; MoE   4: 3 chunked local, 1
                                                                  full
``lfm2``        LFM2: short convolution, attention, conv, attn    2: Mamba-style state
                                                                  (the convolutions),
                                                                  full
==============  ================================================  =======================

``python vllm_models.py ARCH=PATH ...`` builds them (the engine tests build them in one
child process: importing transformers costs seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ARCHS = ("gemma2", "gemma3", "gpt_oss", "mistral", "llama4", "lfm2")
"""The architectures vLLM's CPU build runs, in the order the tests run them."""

WINDOW = 64
"""Tokens of every sliding window and attention chunk: two vLLM blocks."""

INIT_STD = 0.1
"""Weights' standard deviation: larger than transformers' 0.02, so that greedy
decoding of random weights does not settle on one token and a wrong KV byte shows in
the tokens."""

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "initializer_range": INIT_STD,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def _config(arch: str) -> tuple[Any, Any]:
    """The transformers config and model class of ``arch``."""
    import transformers as t

    common = dict(_COMMON)
    if arch == "gemma2":
        layers = ["sliding_attention", "full_attention"] * 2
        cfg = t.Gemma2Config(
            **common, num_hidden_layers=4, head_dim=32, sliding_window=WINDOW, layer_types=layers
        )
        return cfg, t.Gemma2ForCausalLM
    if arch == "gemma3":
        layers = ["sliding_attention"] * 5 + ["full_attention"]
        cfg = t.Gemma3TextConfig(
            **common, num_hidden_layers=6, head_dim=32, sliding_window=WINDOW, layer_types=layers
        )
        return cfg, t.Gemma3ForCausalLM
    if arch == "gpt_oss":
        cfg = t.GptOssConfig(
            **{**common, "intermediate_size": 128},
            num_hidden_layers=2,
            head_dim=32,
            sliding_window=WINDOW,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=False,
        )
        return cfg, t.GptOssForCausalLM
    if arch == "mistral":
        cfg = t.MistralConfig(
            **common,
            num_hidden_layers=2,
            head_dim=32,
            sliding_window=WINDOW,
            tie_word_embeddings=False,
        )
        return cfg, t.MistralForCausalLM
    if arch == "llama4":
        cfg = t.Llama4TextConfig(
            **common,
            intermediate_size_mlp=256,
            num_hidden_layers=4,
            head_dim=32,
            num_local_experts=2,
            num_experts_per_tok=1,
            attention_chunk_size=WINDOW,
            interleave_moe_layer_step=1,
            no_rope_layers=[1, 1, 1, 0],  # 0: a full-attention (NoPE) layer
            tie_word_embeddings=False,
        )
        return cfg, t.Llama4ForCausalLM
    if arch == "lfm2":
        cfg = t.Lfm2Config(
            **common,
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "full_attention"],
            tie_word_embeddings=True,
        )
        # vLLM 0.32 reads LFM2's older config names.
        cfg.conv_dim = cfg.hidden_size
        cfg.conv_L_cache = 3
        cfg.block_dim = cfg.hidden_size
        return cfg, t.Lfm2ForCausalLM
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")


def build_model(arch: str, path: Path, seed: int = 0) -> None:
    """Write a seeded random model of ``arch`` to the checkpoint directory ``path``."""
    import torch

    cfg, cls = _config(arch)
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(path)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        name, _, where = spec.partition("=")
        build_model(name, Path(where))
