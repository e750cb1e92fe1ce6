"""The segmented-LRU policy: one-time blocks go first; ghosts come back protected.

(The lead's contract suite runs over every registered policy, this one included;
these tests pin what makes ``slru`` different from LRU.)
"""

from __future__ import annotations

from kvtier.scheduler import CPUOffloadingManager
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy
from tests.scheduler.policies.twins import block_key as _k
from tests.scheduler.policies.twins import serve_one


def test_reused_blocks_survive_a_scan_of_one_time_blocks() -> None:
    m = CPUOffloadingManager(num_blocks=10, block_size=16, eviction_policy="slru")
    serve_one(m, [1, 2])
    assert serve_one(m, [1, 2]) == 2  # reused: now protected
    for first in range(100, 200, 4):  # a scan of one-time blocks, 2.5x the tier
        serve_one(m, [first, first + 1, first + 2, first + 3])
    assert serve_one(m, [1, 2]) == 2  # LRU would have lost them


def test_lru_loses_them_on_the_same_scan() -> None:
    m = CPUOffloadingManager(num_blocks=10, block_size=16, eviction_policy="lru")
    serve_one(m, [1, 2])
    serve_one(m, [1, 2])
    for first in range(100, 200, 4):
        serve_one(m, [first, first + 1, first + 2, first + 3])
    assert serve_one(m, [1, 2]) == 0


def test_a_ghost_returns_to_protected() -> None:
    policy = SegmentedLRUPolicy(capacity=4)
    for i in range(4):
        policy.add(_k(i))
        policy.release(_k(i))
    victims = policy.choose_victims(1, lambda key: False, (), [_k(9)])
    assert victims == [_k(0)]
    policy.evict(victims)
    assert policy.sizes == (3, 0, 1)
    policy.add(_k(0))  # stored again while a ghost
    assert policy.sizes == (3, 1, 0)


def test_protected_overflow_is_demoted_not_evicted() -> None:
    policy = SegmentedLRUPolicy(capacity=10)  # protected holds 9 at most
    for i in range(10):
        policy.add(_k(i))
        policy.touch(_k(i), reused=True)
    assert policy.sizes == (1, 9, 0)
    assert len(policy) == 10


def test_held_blocks_are_never_chosen() -> None:
    policy = SegmentedLRUPolicy(capacity=3)
    for i in range(3):
        policy.add(_k(i))
    held = {_k(0), _k(2)}
    assert policy.choose_victims(1, held.__contains__, (), []) == [_k(1)]
    assert policy.choose_victims(2, held.__contains__, (), []) is None
    for key in held:  # what the manager does when they become evictable
        policy.release(key)
    assert policy.choose_victims(1, lambda key: False, {_k(1)}, []) == [_k(0)]
