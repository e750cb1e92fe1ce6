"""LRU through the real manager reproduces the reference rows of SOURCES.md.

The figures are the published ones, to the last digit shown; if the replay flow, the
manager or LRU drift, this test says which capacity and which ratio moved.
"""

from __future__ import annotations

import pytest

from kvtier.sim.belady import belady
from kvtier.sim.replay import replay
from kvtier.sim.trace import Trace

# capacity share -> (block, token, request mean), in percent, from SOURCES.md
LRU_ROWS = {
    0.01: (3.81, 3.88, 2.82),
    0.05: (15.66, 15.96, 10.89),
    0.10: (26.23, 26.73, 17.85),
    0.25: (44.41, 45.22, 30.01),
    0.50: (58.88, 59.96, 39.10),
}
BELADY_BLOCK = {0.01: 18.52, 0.05: 39.55, 0.10: 50.63, 0.25: 62.60, 0.50: 63.96}


def test_trace_shape(synthetic_trace: Trace) -> None:
    assert len(synthetic_trace.requests) == 3993
    assert synthetic_trace.num_block_refs == 121877
    assert synthetic_trace.num_distinct_blocks == 43924


@pytest.mark.parametrize("share", sorted(LRU_ROWS))
def test_lru_reproduces_reference(synthetic_trace: Trace, share: float) -> None:
    capacity = round(share * synthetic_trace.num_distinct_blocks)
    ratios = replay(synthetic_trace, capacity, "lru").ratios
    got = (
        round(100 * ratios.block_hit_ratio, 2),
        round(100 * ratios.token_hit_ratio, 2),
        round(100 * ratios.request_hit_ratio_mean, 2),
    )
    assert got == LRU_ROWS[share]


@pytest.mark.parametrize("share", sorted(BELADY_BLOCK))
def test_belady_reproduces_reference(synthetic_trace: Trace, share: float) -> None:
    capacity = round(share * synthetic_trace.num_distinct_blocks)
    assert round(100 * belady(synthetic_trace, capacity).block_hit_ratio, 2) == BELADY_BLOCK[share]


def test_infinite_capacity_is_the_cold_miss_bound(synthetic_trace: Trace) -> None:
    everything = synthetic_trace.num_distinct_blocks
    assert (
        round(100 * replay(synthetic_trace, everything, "lru").ratios.block_hit_ratio, 2) == 63.96
    )
    assert round(100 * belady(synthetic_trace, everything).block_hit_ratio, 2) == 63.96
