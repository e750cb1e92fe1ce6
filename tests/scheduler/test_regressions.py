"""Regression tests for the bug classes vLLM's kv_offload users found one at a time.

Each test tells its scenario. They run for every policy unless the story is ARC's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.scheduler import CPUOffloadingManager
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import ARCPolicy
from kvtier.scheduler.policies.base import IsHeld

from .conftest import keys


def stored(policy: str, n: int, ks: list[bytes], **kw: object) -> CPUOffloadingManager:
    m = CPUOffloadingManager(num_blocks=n, block_size=16, eviction_policy=policy, **kw)
    out = m.prepare_store(ks)
    assert out is not None
    m.complete_store(out.block_hashes_to_store)
    return m


def test_arc_touch_of_unknown_or_evicted_key_is_harmless() -> None:
    # vLLM's ARC raised KeyError when touch() met a key it no longer held (evicted
    # between lookup and touch, or only a ghost). Touch must ignore such keys.
    m = stored("arc", 2, keys(1, 2))
    out = m.prepare_store(keys(3))
    assert out is not None and out.block_hashes_evicted
    gone = out.block_hashes_evicted[0]
    m.touch([gone, keys(99)[0], *keys(3)])  # a ghost, a stranger, a storing block
    m.complete_store(keys(3))
    assert m.lookup(keys(3)) == 1


def test_store_never_evicts_its_own_sibling_blocks(policy: str) -> None:
    # A request storing blocks 1..4 of a prefix whose blocks 1..2 are already resident
    # (and the coldest) must not evict 1..2 to make room for 3..4: that would store
    # the tail of a prefix whose head is gone, and lookup(prefix) would return 0.
    m = stored(policy, 4, keys(1, 2))
    strangers = m.prepare_store(keys(8, 9))  # warmer than 1 and 2
    assert strangers is not None
    m.complete_store(keys(8, 9))
    out = m.prepare_store(keys(1, 2, 3, 4))
    assert out is not None
    assert set(out.block_hashes_evicted) == set(keys(8, 9))
    assert keys(1)[0] in m and keys(2)[0] in m


def test_store_that_would_need_its_own_blocks_is_refused_not_partial(policy: str) -> None:
    # With no stranger to evict, the store cannot be made whole: it returns None and
    # the resident prefix stays intact (eviction is all or nothing).
    m = stored(policy, 3, keys(1, 2, 3))
    assert m.prepare_store(keys(1, 2, 3, 4)) is None
    assert m.lookup(keys(1, 2, 3)) == 3


def test_eviction_succeeds_while_any_evictable_block_exists(policy: str) -> None:
    # vLLM's eviction gave up when the policy's preferred list was pinned, although
    # the other list still had evictable blocks. Pin every block but one, in every
    # arrangement, and a one-block store must still succeed.
    for free in range(4):
        m = stored(policy, 4, keys(1, 2, 3, 4))
        m.touch(keys(3, 4))  # in ARC, 3 and 4 move to T2 (second use)
        others = [k for i, k in enumerate(keys(1, 2, 3, 4)) if i != free]
        m.prepare_load(others)
        out = m.prepare_store(keys(5))
        assert out is not None, f"refused with block {free + 1} evictable"
        assert out.block_hashes_evicted == (keys(1, 2, 3, 4)[free],)


def test_arc_falls_back_to_t1_when_t2_is_all_pinned() -> None:
    m = stored("arc", 4, keys(1, 2, 3, 4))
    m.touch(keys(1, 2))  # T2 = {1, 2}, T1 = {3, 4}
    policy = m.policy
    assert isinstance(policy, ARCPolicy) and policy.sizes[:2] == (2, 2)
    m.prepare_load(keys(3, 4))  # T1 pinned: ARC prefers T1 when |T1| > p = 0
    out = m.prepare_store(keys(5))
    assert out is not None and out.block_hashes_evicted[0] in keys(1, 2)


class CountingHeld:
    """Counts how often eviction asks whether a block is held."""

    def __init__(self, m: TierManager) -> None:
        self.calls = 0
        choose = m.policy.choose_victims

        def counted(
            n: int, is_held: IsHeld, protected: Collection[bytes], incoming: Sequence[bytes]
        ) -> list[bytes] | None:
            def held(key: bytes) -> bool:
                self.calls += 1
                return is_held(key)

            return choose(n, held, protected, incoming)

        m.policy.choose_victims = counted  # type: ignore[method-assign]


def test_eviction_work_does_not_grow_with_pinned_blocks(policy: str) -> None:
    # vLLM's batch eviction walked every pinned block on every call: quadratic.
    # Here, with 2,000 pinned blocks at the cold end, 200 one-block stores must ask
    # about each pinned block a bounded number of times in total, not 200 times.
    n_pinned, n_free = 2000, 200
    m = stored(policy, n_pinned + n_free, [f"p{i}".encode() for i in range(n_pinned)])
    m.prepare_load([f"p{i}".encode() for i in range(n_pinned)])
    out = m.prepare_store([f"e{i}".encode() for i in range(n_free)])
    assert out is not None
    m.complete_store(out.block_hashes_to_store)
    counter = CountingHeld(m)
    for i in range(n_free):
        out = m.prepare_store([f"new{i}".encode()])
        assert out is not None and len(out.block_hashes_evicted) == 1
        m.complete_store(out.block_hashes_to_store)
    assert counter.calls <= 2 * n_pinned + 10 * n_free, counter.calls


def test_touch_of_storing_block_is_not_a_second_use() -> None:
    # The replay touches a request's blocks while they are still being stored. ARC
    # must keep them in T1 (recency list); only a touch of a READY block is a reuse.
    m = CPUOffloadingManager(num_blocks=4, block_size=16, eviction_policy="arc")
    assert m.prepare_store(keys(1, 2)) is not None
    m.touch(keys(1, 2))
    m.complete_store(keys(1, 2))
    policy = m.policy
    assert isinstance(policy, ARCPolicy)
    assert policy.sizes[:2] == (2, 0)
    m.touch(keys(1))
    assert policy.sizes[:2] == (1, 1)


def test_touch_makes_the_first_key_the_most_recent(policy: str) -> None:
    # Prefix heads must outlive their tails: after touch([a, b, c]), c is evicted
    # first, then b, then a.
    m = stored(policy, 3, keys(1, 2, 3))
    m.touch(keys(1, 2, 3))
    evicted = []
    for i in range(4, 7):
        out = m.prepare_store(keys(i))
        assert out is not None
        evicted += out.block_hashes_evicted
        m.complete_store(keys(i))
        m.touch(keys(i))
    assert evicted == keys(3, 2, 1)


def test_failed_store_of_a_pinned_ready_block_keeps_it(policy: str) -> None:
    # complete_store(success=False) over a batch that also lists a block already READY
    # (and pinned by a load in flight) must not drop that block.
    m = stored(policy, 4, keys(1))
    m.prepare_load(keys(1))
    assert m.prepare_store(keys(1, 2)) is not None
    m.complete_store(keys(1, 2), success=False)
    assert m.lookup(keys(1)) == 1 and m.pins(keys(1)[0]) == 1
