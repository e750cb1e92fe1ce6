"""Shared fixtures of the observability tests: the tiny seeded Llama, built once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from kvtier.engine import build_model
from tests.tiny import TINY


@pytest.fixture(scope="session")
def tiny_model() -> PreTrainedModel:
    torch.set_num_threads(1)  # the tiny model's matmuls take microseconds
    return build_model(TINY, seed=0, device="cpu")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model: PreTrainedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved as a local Hugging Face checkpoint (for ``--model PATH``)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(path)
    return path
