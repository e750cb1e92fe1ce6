"""Replays through every registered policy respect capacity and the replay flow."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.scheduler import POLICIES, OffloadingManager
from kvtier.scheduler.manager import TierManager
from kvtier.sim.replay import replay
from kvtier.sim.trace import Trace, trace_from_requests
from kvtier.sim.workload import WorkloadConfig, generate

WORKLOAD = generate(WorkloadConfig(seed=3, requests=600))


def _trace(requests: list[list[int]]) -> Trace:
    return trace_from_requests(
        [(float(i), 4 * len(ids), 1, ids) for i, ids in enumerate(requests)], block_size=4
    )


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("capacity", [1, 7, 64, 500])
def test_every_policy_respects_capacity(policy: str, capacity: int) -> None:
    peak = 0

    def check(manager: OffloadingManager) -> None:
        nonlocal peak
        assert isinstance(manager, TierManager)
        assert len(manager) <= capacity
        assert len(manager.policy) == len(manager)
        peak = max(peak, len(manager))

    result = replay(WORKLOAD, capacity, policy, after_request=check)
    if capacity > 1:  # at 1 block every request is too big to store
        assert peak == capacity
    assert result.stats is not None and result.stats.hit_blocks == result.ratios.hit_blocks
    assert 0.0 <= result.ratios.block_hit_ratio <= 1.0


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_repeated_prompt_hits_in_full(policy: str) -> None:
    result = replay(_trace([[1, 2, 3], [1, 2, 3], [1, 2, 9]]), 8, policy)
    assert result.ratios.hit_blocks == 3 + 2


def test_a_request_bigger_than_the_tier_is_not_stored() -> None:
    result = replay(_trace([[1, 2, 3], [1, 2, 3]]), 2, "lru")
    assert result.ratios.hit_blocks == 0
    assert result.stats is not None and result.stats.stores_rejected == 6


def test_zero_capacity_and_unknown_policy() -> None:
    assert replay(_trace([[1], [1]]), 0, "lru").ratios.hit_blocks == 0
    with pytest.raises(ConfigError, match="unknown policy"):
        replay(_trace([[1]]), 0, "nope")
    with pytest.raises(ConfigError, match="unknown policy"):
        replay(_trace([[1]]), 4, "nope")


def test_ratios_are_labelled_and_differ() -> None:
    # request 2 hits 1 of 1 block; request 3 hits 1 of 3 blocks: means differ.
    ratios = replay(_trace([[1], [1], [1, 5, 6]]), 8, "lru").ratios
    assert ratios.block_hit_ratio == pytest.approx(2 / 5)
    assert ratios.request_hit_ratio_mean == pytest.approx((0 + 1 + 1 / 3) / 3)
    assert ratios.token_hit_ratio == pytest.approx(8 / 20)


def test_workload_is_deterministic() -> None:
    again = generate(WorkloadConfig(seed=3, requests=600))
    assert again.requests == WORKLOAD.requests
    assert generate(WorkloadConfig(seed=4, requests=600)).requests != WORKLOAD.requests
