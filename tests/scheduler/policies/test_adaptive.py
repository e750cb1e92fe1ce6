"""The adaptive policy: LRU at share 0, slru's structure above, shares picked by shadows."""

from __future__ import annotations

from dataclasses import replace

from kvtier.blocks import BlockHash, Medium
from kvtier.scheduler import CPUOffloadingManager, OffloadingManager
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import AdaptivePolicy
from kvtier.scheduler.policies.adaptive import SHARES
from kvtier.sim.replay import replay
from kvtier.sim.workload import generate, shaped


def _k(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def _request(m: TierManager, ids: list[int]) -> int:
    keys = [_k(i) for i in ids]
    hit = m.lookup(keys)
    m.touch(keys)
    out = m.prepare_store(keys[hit:])
    m.touch(keys)
    if out is not None:
        m.complete_store(out.block_hashes_to_store)
    return hit


def _workload() -> list[list[int]]:
    """Chats that extend their history, with one-time scans between them."""
    requests: list[list[int]] = []
    chats = [[1000 * c] for c in range(6)]
    fresh = 10**6
    for step in range(400):
        chat = chats[step % 6]
        chat.append(chat[-1] + 1)
        requests.append(list(chat[-12:]))  # the last 12 blocks of its history
        if step % 3 == 0:
            requests.append(list(range(fresh, fresh + 9)))  # a one-time scan
            fresh += 9
    return requests


class _Frozen(AdaptivePolicy):
    """Never decides: keeps the share it starts with."""

    def __init__(self, capacity: int, leader: int) -> None:
        super().__init__(capacity)
        self._left = 10**12
        self._leader = leader
        self._protected_cap = int(capacity * SHARES[leader])


def _hits(policy_name: str | None, capacity: int, leader: int = 0) -> int:
    if policy_name is None:
        m = TierManager(
            medium=Medium.CPU, num_blocks=capacity, block_size=16, policy=_Frozen(capacity, leader)
        )
    else:
        m = CPUOffloadingManager(num_blocks=capacity, block_size=16, eviction_policy=policy_name)
    return sum(_request(m, ids) for ids in _workload())


def test_share_zero_is_exactly_lru() -> None:
    for capacity in (10, 40, 90):
        assert _hits(None, capacity, leader=0) == _hits("lru", capacity)


def test_share_point_nine_is_exactly_slru() -> None:
    assert SHARES[-1] == 0.9
    for capacity in (10, 40, 90):
        assert _hits(None, capacity, leader=len(SHARES) - 1) == _hits("slru", capacity)


def test_it_starts_as_slru_and_moves_to_the_winning_share() -> None:
    # Documents asked about again soon: protecting reused blocks starves probation,
    # so the shadows soon find share 0 (LRU) better and the tier follows them.
    trace = generate(replace(shaped("documents", 7, block_size=16), requests=600))
    shares: list[float] = []

    def share(m: OffloadingManager) -> None:
        assert isinstance(m, TierManager) and isinstance(m.policy, AdaptivePolicy)
        shares.append(m.policy.share)

    hits = replay(trace, 229, "adaptive", after_request=share).ratios.hit_blocks
    assert shares[0] == 0.9 and shares.index(0.0) == 29 and set(shares[29:]) == {0.0}
    assert hits == 8741
    assert [replay(trace, 229, p).ratios.hit_blocks for p in ("lru", "slru")] == [8973, 5299]


def test_a_shrinking_share_trims_protected_gradually() -> None:
    policy = AdaptivePolicy(20)
    policy._protected_cap = 18  # as a decision for share 0.9 would set it
    for i in range(20):
        policy.add(_k(i))
        policy.release(_k(i))
        policy.touch(_k(i), True)  # every block reused: protected up to 90 %
    assert policy.sizes[:2] == (2, 18)
    policy._protected_cap = 0  # as a decision for share 0 would set it
    policy.touch(_k(0), True)  # a promotion demotes up to two blocks
    policy.add(_k(99))
    policy.touch(_k(99), True)
    assert policy.sizes[1] < 18
