"""Shared fixtures of the observability tests: the tiny seeded Llama, built once."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from kvtier.engine import build_model
from tests.tiny import TINY


@pytest.fixture(scope="session")
def tiny_model() -> PreTrainedModel:
    torch.set_num_threads(1)  # the tiny model's matmuls take microseconds
    return build_model(TINY, seed=0, device="cpu")
