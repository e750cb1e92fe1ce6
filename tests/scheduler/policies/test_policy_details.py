"""Small facts about the policies that random sequences reach only now and then.

Each test here was written to kill a mutant that survived ``scripts/mutate.sh`` under
the mutation profile (a tenth of the Hypothesis examples): the reference-model tests
would usually catch these too, but a guard that works only by luck is not a guard.
"""

from __future__ import annotations

import pytest

from kvtier.blocks import BlockHash
from kvtier.scheduler import POLICIES, CPUOffloadingManager
from kvtier.scheduler.policies import ARCPolicy, make_policy
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy


def k(i: int) -> BlockHash:
    return BlockHash(f"k{i}".encode())


def never_held(key: BlockHash) -> bool:
    return False


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_knows_its_capacity(name: str) -> None:
    assert make_policy(name, 7).capacity == 7


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_parked_blocks_come_back_with_release_all_in_order(name: str) -> None:
    policy = make_policy(name, 4)
    keys = [k(i) for i in range(3)]
    policy.add_all(keys)  # being stored: held
    assert policy.choose_victims(1, lambda key: True, (), []) is None  # parks all three
    policy.release_all(keys)
    assert policy.choose_victims(3, never_held, (), []) == keys


def test_the_default_release_all_releases_each_key_in_order() -> None:
    released: list[BlockHash] = []

    class Recording(EvictionPolicy):
        def add(self, key: BlockHash) -> None: ...
        def touch(self, key: BlockHash, reused: bool) -> None: ...
        def remove(self, key: BlockHash) -> None: ...
        def release(self, key: BlockHash) -> None:
            released.append(key)

        def choose_victims(
            self, n: int, is_held: IsHeld, protected: object, incoming: object
        ) -> list[BlockHash] | None:
            return None

        def evict(self, victims: object) -> None: ...

    Recording(2).release_all([k(1), k(2)])
    assert released == [k(1), k(2)]


def test_arc_a_returning_b2_ghost_leaves_b2() -> None:
    arc = ARCPolicy(2)
    for i in range(2):
        arc.add(k(i))
        arc.release(k(i))
    arc.touch(k(0), reused=True)  # T1 = [1], T2 = [0]
    arc.p = 2  # prefer T2
    arc.evict([k(0)])
    assert arc.sizes == (1, 0, 0, 1)
    arc.add(k(0))
    assert arc.sizes == (1, 1, 0, 0)
    assert arc.p == 1


def test_arc_a_ghost_stored_through_the_manager_goes_to_t2() -> None:
    """The manager adds in batches (``add_all``): a returning ghost in a batch must be
    handled as one, not put in T1 by the batch's fast path."""
    m = CPUOffloadingManager(num_blocks=2, block_size=16, eviction_policy="arc")
    arc = m.policy
    assert isinstance(arc, ARCPolicy)
    for i in (0, 1, 2):
        out = m.prepare_store([k(i)])
        assert out is not None
        m.complete_store(out.block_hashes_to_store)
        if i == 1:
            m.touch([k(1)])  # a second use: T2
    assert arc.sizes == (1, 1, 1, 0), "T1 = [k2], T2 = [k1], B1 = [k0]"
    out = m.prepare_store([k(0), k(3)])
    assert out is not None and out.block_hashes_evicted == (k(1), k(2))
    # k0 comes back from B1 into T2 (p grows to 1); k3 is new in T1; B1 = [k2], B2 = [k1].
    assert arc.sizes == (1, 1, 1, 1)
    assert arc.p == 1


def test_slru_protected_share_rounds_down_to_one_of_two() -> None:
    policy = SegmentedLRUPolicy(2)  # protected holds int(0.9 * 2) = 1
    for i in range(2):
        policy.add(k(i))
        policy.release(k(i))
        policy.touch(k(i), reused=True)
    assert policy.sizes == (1, 1, 0)


def test_slru_ghosts_are_four_times_the_tier_oldest_forgotten_first() -> None:
    policy = SegmentedLRUPolicy(2)  # 8 ghosts
    for i in range(10):  # from the third on, each new key evicts the coldest
        if len(policy) == 2:
            victims = policy.choose_victims(1, never_held, (), [k(i)])
            assert victims is not None
            policy.evict(victims)
        policy.add(k(i))
        policy.release(k(i))
    assert policy.sizes == (2, 0, 8)  # ghosts k0 .. k7
    evicted = policy.choose_victims(2, never_held, (), [])
    assert evicted == [k(8), k(9)]
    policy.evict(evicted)  # ghosts k2 .. k9: k0 and k1 forgotten, oldest first
    assert policy.sizes == (0, 0, 8)
    policy.add(k(1))  # forgotten: a new key, on probation
    policy.add(k(2))  # the oldest remembered ghost: protected
    assert policy.sizes == (1, 1, 7)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_one_by_one_adds_and_a_release_keep_lru_order(name: str) -> None:
    policy = make_policy(name, 4)
    for i in range(3):
        policy.add(k(i))
    held = {k(0)}
    assert policy.choose_victims(1, held.__contains__, (), []) == [k(1)]  # parks k0
    policy.release(k(0))
    assert policy.choose_victims(3, never_held, (), []) == [k(0), k(1), k(2)]


def arc_with(t1: int, t2: int, p: int) -> ARCPolicy:
    """An ARC of 8 blocks holding ``t1`` blocks in T1 (k0..) and ``t2`` in T2 (k100..)."""
    arc = ARCPolicy(8)
    for i in range(t2):
        arc.add(k(100 + i))
        arc.release(k(100 + i))
        arc.touch(k(100 + i), reused=True)
    for i in range(t1):
        arc.add(k(i))
        arc.release(k(i))
    arc.p = p
    return arc


def test_arc_takes_from_t1_while_it_is_over_target_counting_each_victim() -> None:
    arc = arc_with(t1=3, t2=2, p=1)
    # |T1| = 3 > 1: k0 (|T1| now 2 > 1): k1 (|T1| now 1, not > 1): T2's coldest.
    assert arc.choose_victims(4, never_held, (), []) == [k(0), k(1), k(100), k(101)]


def test_arc_a_single_t1_block_over_a_zero_target_goes_first() -> None:
    arc = arc_with(t1=1, t2=1, p=0)
    assert arc.choose_victims(1, never_held, (), []) == [k(0)]
    arc = arc_with(t1=1, t2=1, p=1)  # |T1| == p: T2
    assert arc.choose_victims(1, never_held, (), []) == [k(100)]


def test_arc_p_moves_by_the_ghost_ratio_rounded_down_and_stays_in_range() -> None:
    arc = ARCPolicy(8)
    arc._b1.update(dict.fromkeys([k(1), k(2), k(3)]))
    arc._b2.update(dict.fromkeys([k(4), k(5)]))
    assert arc._adapted(3, k(4)) == 2  # a B2 hit: p - max(1, 3 // 2)
    assert arc._adapted(1, k(4)) == 0
    assert arc._adapted(0, k(4)) == 0  # never below 0
    assert arc._adapted(3, k(1)) == 4  # a B1 hit: p + max(1, 2 // 3)
    assert arc._adapted(8, k(1)) == 8  # never above the capacity
    assert arc._adapted(3, k(9)) == 3  # not a ghost
    arc._b2.update(dict.fromkeys([k(6), k(7), k(8), k(10), k(11)]))  # |B2| = 7
    assert arc._adapted(3, k(1)) == 5  # p + 7 // 3


def test_slru_demotes_the_coldest_protected_block_even_when_it_is_pinned() -> None:
    policy = SegmentedLRUPolicy(4)  # protected holds 3
    for i in range(4):
        policy.add(k(i))
        policy.release(k(i))
    for i in (0, 1, 2):
        policy.touch(k(i), reused=True)  # protected [k0, k1, k2], probation [k3]
    pinned = {k(0), k(3)}
    # A search walks probation (k3 pinned), then protected, where it parks pinned k0.
    assert policy.choose_victims(2, pinned.__contains__, (), []) == [k(1), k(2)]
    policy.touch(k(3), reused=True)  # protected overflows: demote its coldest, k0
    assert policy.choose_victims(1, never_held, (), []) == [k(0)]


def test_an_unknown_policy_names_the_key_and_the_choices() -> None:
    from kvtier.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        make_policy("fifo", 4)
    assert err.value.key == "eviction_policy"
    assert "'fifo'" in str(err.value) and "adaptive, arc, density, leader, lru, slru" in str(
        err.value
    )
