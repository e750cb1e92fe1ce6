"""Shared fixtures of the ``kvtier run`` tests: a tiny seeded Llama and a tiny workload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from kvtier.engine import build_model
from kvtier.run.workload import WorkloadSpec
from tests.tiny import TINY

TINY_WORKLOAD = WorkloadSpec(
    conversations=3, turns=3, system_tokens=40, user_tokens=(10, 30), answer_tokens=(3, 6)
)
"""Prompts up to ~170 tokens; with 4-token pages, 3 conversations overflow a small pool."""


@pytest.fixture(scope="session")
def tiny_model() -> PreTrainedModel:
    # The tiny model's matmuls take microseconds; more threads only add overhead.
    torch.set_num_threads(1)
    return build_model(TINY, seed=0, device="cpu")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model: PreTrainedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved as a local Hugging Face checkpoint (for ``--model PATH``)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(path)
    return path
