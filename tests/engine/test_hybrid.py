"""The engine over a sliding-window hybrid (Gemma 3-style): windows without vLLM.

``ModelSize(sliding_window=...)`` builds a Gemma 3-style model: sliding-window layers
and full-attention layers. The engine pages every layer's KV; the model's own masks
keep a sliding layer to its window. These tests check that the paged engine computes
what the model computes on its own, that offloading gives the same tokens, and that
the window is really in force (a wider one gives other tokens).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier.engine import LLM, build_model
from kvtier.engine.models import load_model, save_model
from tests.byte_oracle import install_recorder
from tests.tiny import TINY

from .workload import GPU_BLOCKS, PAGE, chats

HYBRID = replace(TINY, num_layers=4, sliding_window=8, full_every=2, init_std=0.1)
"""Sliding, full, sliding, full; an 8-token window (two pages of 4)."""


@pytest.fixture(scope="module")
def hybrid() -> Any:
    torch.set_num_threads(1)
    return build_model(HYBRID, seed=0, device="cpu")


def greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """The model on its own: the whole sequence each step, no cache."""
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(n):
            token = int(model(ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def test_the_hybrid_has_sliding_and_full_layers(hybrid: Any) -> None:
    config = hybrid.config
    assert type(hybrid).__name__ == "Gemma3ForCausalLM"
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert config.sliding_window == 8


def test_the_paged_engine_computes_what_the_model_computes_alone(hybrid: Any) -> None:
    """Prompts of different lengths in one batch (left-padded pasts), all past the
    window."""
    prompts = [[(7 * i + j) % 500 for i in range(30 + 5 * j)] for j in range(3)]
    llm = LLM(model=hybrid, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE)
    assert llm.generate(prompts, max_new_tokens=6) == [greedy(hybrid, p, 6) for p in prompts]


def test_the_window_is_in_force(hybrid: Any) -> None:
    """The control: the same weights with a window wider than the prompts attend to
    everything, and give other tokens."""
    wide = build_model(replace(HYBRID, sliding_window=4096), seed=0, device="cpu")
    prompt = [(7 * i + 3) % 500 for i in range(40)]
    assert greedy(wide, prompt, 6) != greedy(hybrid, prompt, 6)


def test_offloading_gives_the_same_tokens(hybrid: Any) -> None:
    def serve(offload: dict[str, Any] | None) -> tuple[list[list[int]], int]:
        llm = LLM(model=hybrid, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=offload)
        recorder = install_recorder(llm) if offload is not None else None
        outs, loaded = [], 0
        for p in chats():
            outs += llm.generate([p], max_new_tokens=4)
            assert llm.last_stats is not None
            loaded += llm.last_stats.offload.loaded_blocks
        llm.close()
        if recorder is not None:  # the byte oracle: every page loaded is the page stored
            assert recorder.mismatches == []
            assert recorder.pages_checked >= loaded
        return outs, loaded

    reference, _ = serve(None)
    outs, loaded = serve({"cpu_bytes_to_use": "8MiB", "block_size": PAGE})
    assert outs == reference
    assert loaded == 51  # the conversations' evicted pages came back from the CPU tier


def test_a_saved_hybrid_loads_as_a_checkpoint(hybrid: Any, tmp_path: Path) -> None:
    """What ``kvtier run --model PATH`` loads."""
    path = save_model(HYBRID, tmp_path / "hybrid", seed=0)
    again = load_model(path, device="cpu")
    prompt = [(11 * i + 5) % 500 for i in range(24)]
    assert greedy(again, prompt, 4) == greedy(hybrid, prompt, 4)
