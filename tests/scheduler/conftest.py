"""Shared fixtures: every scheduler test that takes ``policy`` runs for every policy."""

from __future__ import annotations

import pytest

from kvtier.scheduler import POLICIES


def keys(*ids: int) -> list[bytes]:
    """Readable block keys: ``keys(1, 2)`` -> ``[b"k1", b"k2"]``."""
    return [f"k{i}".encode() for i in ids]


@pytest.fixture(params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest) -> str:
    return str(request.param)
