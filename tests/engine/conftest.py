"""Shared fixtures of the engine tests: one tiny seeded Llama, built once."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import PreTrainedModel

from kvtier.engine import ModelSize, build_model
from tests.tiny import TINY


@pytest.fixture(scope="session")
def tiny_model() -> PreTrainedModel:
    # The tiny model's matmuls take microseconds; intra-op threads only add overhead
    # (milliseconds per op when the cores are shared).
    torch.set_num_threads(1)
    return build_model(TINY, seed=0, device="cpu")


def random_prompts(
    seed: int, n: int, shared: int, tail: tuple[int, int], vocab: int = TINY.vocab_size
) -> list[list[int]]:
    """``n`` prompts: a common ``shared``-token prefix plus a random tail of length in ``tail``."""
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab) for _ in range(shared)]
    return [prefix + [rng.randrange(vocab) for _ in range(rng.randint(*tail))] for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_size() -> ModelSize:
    return TINY


@pytest.fixture(scope="session")
def make_prompts():  # type: ignore[no-untyped-def]
    """``random_prompts`` as a fixture (test modules do not import each other)."""
    return random_prompts


@pytest.fixture(scope="session")
def baseline(tiny_model: PreTrainedModel) -> list[list[int]]:
    """The tokens of the offloading tests' chat workload, served without offloading."""
    from kvtier.engine import LLM

    from .workload import GPU_BLOCKS, PAGE, chats

    llm = LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE)
    return [out for p in chats() for out in llm.generate([p], max_new_tokens=4)]
