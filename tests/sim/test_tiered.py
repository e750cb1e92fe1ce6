"""The tiered replay: a CPU tier with a disk tier behind it, through the TieredManager."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.errors import ConfigError
from kvtier.sim.replay import replay
from kvtier.sim.trace import Trace, trace_from_requests
from kvtier.sim.workload import generate, shaped


def _trace(requests: list[list[int]]) -> Trace:
    return trace_from_requests(
        [(float(i), 4 * len(ids), 1, ids) for i, ids in enumerate(requests)], block_size=4
    )


def test_blocks_evicted_from_cpu_are_served_by_disk() -> None:
    # CPU holds 2 blocks: [3, 4] pushes [1, 2] out of it, but not out of the disk.
    result = replay(_trace([[1, 2], [3, 4], [1, 2], [1, 2]]), 2, "lru", disk_capacity_blocks=8)
    cpu, disk = result.tiers
    assert (cpu.medium, cpu.capacity_blocks, disk.medium, disk.capacity_blocks) == (
        "CPU",
        2,
        "DISK",
        8,
    )
    # request 3 hits both blocks on disk (promoted), request 4 hits them in CPU
    assert (cpu.hit_blocks, disk.hit_blocks) == (2, 2)
    assert result.ratios.hit_blocks == 4
    assert disk.block_hit_ratio == pytest.approx(2 / 8)
    # without the disk tier, request 3 misses
    assert replay(_trace([[1, 2], [3, 4], [1, 2], [1, 2]]), 2, "lru").ratios.hit_blocks == 2


def test_a_disk_as_big_as_the_trace_reaches_the_cold_miss_bound() -> None:
    trace = generate(replace(shaped("chat", 5, block_size=16), requests=600))
    everything = replay(trace, trace.num_distinct_blocks, "lru").ratios.hit_blocks
    tiered = replay(trace, 50, "adaptive", disk_capacity_blocks=trace.num_distinct_blocks)
    assert tiered.ratios.hit_blocks == everything
    assert tiered.tiers[0].hit_blocks + tiered.tiers[1].hit_blocks == everything


def test_negative_disk_capacity_is_refused() -> None:
    with pytest.raises(ConfigError, match="disk_capacity_blocks"):
        replay(_trace([[1]]), 4, "lru", disk_capacity_blocks=-1)
