"""Shared fixtures of the simulator tests: the published synthetic trace."""

from __future__ import annotations

import pytest

from kvtier.sim.trace import Trace, read_mooncake
from kvtier.sim.traces import SYNTHETIC_TRACE


@pytest.fixture(scope="session")
def synthetic_trace() -> Trace:
    """Mooncake's synthetic trace, the copy shipped in the package."""
    return read_mooncake(SYNTHETIC_TRACE)
