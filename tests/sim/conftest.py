"""Shared fixtures of the simulator tests: the published synthetic trace, if present."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.sim.trace import Trace, read_mooncake

_REPO = Path(__file__).resolve().parents[2]
SYNTHETIC = _REPO.parent / "shared" / "data" / "traces" / "synthetic_trace.jsonl"


@pytest.fixture(scope="session")
def synthetic_trace() -> Trace:
    """Mooncake's synthetic trace (skips where the shared data folder is absent)."""
    if not SYNTHETIC.is_file():
        pytest.skip(f"synthetic trace not found at {SYNTHETIC} (shared data not checked out)")
    return read_mooncake(SYNTHETIC)
