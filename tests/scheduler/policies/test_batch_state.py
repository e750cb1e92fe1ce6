"""Every batch path leaves a policy's whole state as its per-key operations would.

``test_batch_paths`` compares eviction orders; this compares everything a policy
keeps -- each list in order (parked blocks included), the ghost lists in order, ARC's
``p``, the adaptive tier's last-use times and clock -- after every step of a random
history, for ``add_all``, ``touch_all``, ``evict`` and ``remove_all`` against ``add``,
``touch``, one-victim ``evict`` calls and ``remove``. Two copies of a policy live the
same history, one through the batch path and one key by key (the oracle). The tier is
small and the keys few, so ghosts return, protected overflows and demotes, and held
blocks get parked and released; the histories include ``observe`` so the adaptive
tier changes its share.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import EvictionPolicy, make_policy
from kvtier.scheduler.policies.adaptive import AdaptivePolicy
from kvtier.scheduler.policies.arc import ARCPolicy
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy

CAPACITY = 12  # slru's protected holds 10: two blocks can be promoted past it at once
KEYS = [BlockHash(bytes([i])) for i in range(20)]
BATCHED = ("lru", "arc", "slru", "adaptive")


def state(policy: EvictionPolicy) -> dict[str, Any]:
    """Everything the policy keeps, in order, as plain values."""
    if isinstance(policy, LRUPolicy):
        return {"list": policy._list.ordered()}
    if isinstance(policy, ARCPolicy):
        return {
            "t1": policy._t1.ordered(),
            "t2": policy._t2.ordered(),
            "b1": list(policy._b1),
            "b2": list(policy._b2),
            "p": policy.p,
        }
    assert isinstance(policy, SegmentedLRUPolicy)
    out: dict[str, Any] = {
        "probation": policy._probation.ordered(),
        "protected": policy._protected.ordered(),
        "ghost": list(policy._ghost),
    }
    if isinstance(policy, AdaptivePolicy):
        out["times"] = [lst.time(k) for lst in policy._timed for k in lst.ordered()]
        out["clock"] = repr(policy._clock)
        out["share"] = policy.share
    return out


@pytest.mark.parametrize("name", BATCHED)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_batch_paths_keep_the_per_key_state(name: str, data: st.DataObject) -> None:
    batch, oracle = make_policy(name, CAPACITY), make_policy(name, CAPACITY)
    resident: list[BlockHash] = []
    held: set[BlockHash] = set()
    # Reuses of a few blocks, often: protected fills, and a batch promotes past its cap.
    ops = ["add", "touch", "reuse", "reuse", "reuse", "hold", "release", "evict", "remove"]
    ops.append("observe")
    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        op = data.draw(st.sampled_from(ops))
        absent = [k for k in KEYS if k not in resident]
        if op == "add" and absent and len(resident) < CAPACITY:
            keys = data.draw(st.lists(st.sampled_from(absent), min_size=1, unique=True))
            keys = keys[: CAPACITY - len(resident)]
            batch.add_all(keys)
            for key in keys:
                oracle.add(key)
            resident += keys
            held.update(keys)  # being stored
        elif op in ("touch", "reuse") and resident:
            size = 4 if op == "reuse" else 12
            keys = data.draw(st.lists(st.sampled_from(resident), min_size=1, max_size=size))
            # "reuse": no key is being stored (the path that promotes in one pass).
            storing = (
                set() if op == "reuse" else set(data.draw(st.lists(st.sampled_from(resident))))
            )
            batch.touch_all(keys, storing)
            for key in keys:
                oracle.touch(key, key not in storing)
        elif op == "hold" and resident:
            held.update(data.draw(st.lists(st.sampled_from(resident), min_size=1)))
        elif op == "release" and held:
            keys = data.draw(st.lists(st.sampled_from(sorted(held)), min_size=1, unique=True))
            held.difference_update(keys)
            for p in (batch, oracle):
                p.release_all(keys)
        elif op == "evict":
            n = data.draw(st.integers(1, 6))
            victims = batch.choose_victims(n, held.__contains__, (), ())
            assert victims == oracle.choose_victims(n, held.__contains__, (), ())
            if victims is not None:
                batch.evict(victims)
                for key in victims:
                    oracle.evict([key])
                resident = [k for k in resident if k not in victims]
        elif op == "remove" and resident and isinstance(batch, SegmentedPolicy):
            keys = data.draw(st.lists(st.sampled_from(resident), min_size=1, unique=True))
            batch.remove_all(keys)
            for key in keys:
                oracle.remove(key)
            resident = [k for k in resident if k not in keys]
            held.difference_update(keys)
        elif op == "observe":
            keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=8))
            for p in (batch, oracle):
                p.observe(keys)
        assert state(batch) == state(oracle)
        assert len(batch) == len(oracle) == len(resident)


@pytest.mark.parametrize("name", ["slru", "adaptive"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_reuse_batches_promote_and_demote_as_key_by_key(name: str, data: st.DataObject) -> None:
    """A full tier whose protected list is at or near its cap, reused a few blocks at a
    time: each batch may promote several blocks and demote as many, in one pass."""
    batch, oracle = make_policy(name, CAPACITY), make_policy(name, CAPACITY)
    keys = KEYS[:CAPACITY]
    warm = data.draw(st.lists(st.sampled_from(keys), min_size=8), label="warm")
    held = set(data.draw(st.lists(st.sampled_from(keys)), label="held"))
    for p in (batch, oracle):
        p.add_all(keys)
        for key in warm:  # fills protected, key by key in both copies
            p.touch(key, True)
        p.choose_victims(1, held.__contains__, (), ())  # parks held blocks
    assert state(batch) == state(oracle)
    for _ in range(data.draw(st.integers(1, 12), label="batches")):
        reused = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4))
        batch.touch_all(reused, set())
        for key in reused:
            oracle.touch(key, True)
        assert state(batch) == state(oracle)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_remove_found_is_remove_of_each_key_found(data: st.DataObject) -> None:
    names = [str(i) for i in range(10)]
    batch: RecencyList[str] = RecencyList()
    oracle: RecencyList[str] = RecencyList()
    start = data.draw(st.permutations(names), label="order")
    for rl in (batch, oracle):
        rl.add_all(start)
    held = set(data.draw(st.lists(st.sampled_from(names)), label="held"))
    for rl in (batch, oracle):  # park the held run at the cold end
        gen = rl.evictable(held.__contains__, ())
        next(gen, None)
        gen.close()
    for key in data.draw(st.lists(st.sampled_from(names), unique=True), label="gone"):
        for rl in (batch, oracle):
            rl.remove(key)
    keys = data.draw(st.lists(st.sampled_from([*names, "x", "y"]), unique=True), label="keys")
    others = batch.remove_found(keys)
    expected = []
    for key in keys:
        if key in oracle:
            oracle.remove(key)
        else:
            expected.append(key)
    assert others == expected
    assert batch.ordered() == oracle.ordered()
    assert batch.first_n(3) == oracle.ordered()[:3]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_touch_listed_touches_the_keys_before_the_first_parked_or_absent_one(
    data: st.DataObject,
) -> None:
    names = [str(i) for i in range(8)]
    batch: RecencyList[str] = RecencyList()
    oracle: RecencyList[str] = RecencyList()
    start = data.draw(st.permutations(names), label="order")
    held = set(data.draw(st.lists(st.sampled_from(names)), label="held"))
    for rl in (batch, oracle):
        rl.add_all(start[:6])  # "6" and "7" are not in the list
        gen = rl.evictable(held.__contains__, ())  # parks the held run at the cold end
        next(gen, None)
        gen.close()
    keys = data.draw(st.lists(st.sampled_from(names), max_size=8), label="keys")
    done = batch.touch_listed(keys)
    listed = set(oracle.ordered()) - set(oracle._parked)
    expected = next((i for i, key in enumerate(keys) if key not in listed), len(keys))
    assert done == expected
    for key in keys[:done]:
        oracle.touch(key)
    assert batch.ordered() == oracle.ordered()


def test_remove_all_raises_for_a_key_not_in_the_list() -> None:
    rl: RecencyList[str] = RecencyList()
    rl.add_all(["a", "b", "c"])
    with pytest.raises(KeyError, match="z"):
        rl.remove_all(["b", "z"])
    policy = make_policy("slru", 4)
    assert isinstance(policy, SegmentedPolicy)
    policy.add_all([KEYS[0]])
    with pytest.raises(KeyError):
        policy.remove_all([KEYS[0], KEYS[1]])


def test_arc_evicts_victims_of_both_lists_to_their_own_ghosts() -> None:
    a, b, c, d = KEYS[:4]
    policy = make_policy("arc", 4)
    policy.add_all([a, b, c, d])
    policy.touch_all([d, c, b], set())  # reused: T1 = [a], T2 = [d, c, b]
    victims = policy.choose_victims(3, lambda key: False, (), ())
    assert victims == [a, d, c]  # T1's one block (|T1| > p = 0), then T2's coldest
    policy.evict(victims)
    assert state(policy) == {"t1": [], "t2": [b], "b1": [a], "b2": [d, c], "p": 0}


@pytest.mark.parametrize("name", ["slru", "adaptive"])
def test_a_batch_promoting_more_blocks_than_protected_holds(name: str) -> None:
    """Four probation blocks reused at once in a tier of 4 (protected holds 3): the
    first promoted block is demoted again by the fourth, as key by key."""
    policy = make_policy(name, 4)
    policy.add_all(KEYS[:4])
    policy.touch_all(KEYS[:4], set())
    assert isinstance(policy, SegmentedLRUPolicy)
    assert policy._probation.ordered() == [KEYS[0]]
    assert policy._protected.ordered() == KEYS[1:4]
