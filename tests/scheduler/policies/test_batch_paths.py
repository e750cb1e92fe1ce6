"""The batch paths are the per-key operations, only faster.

``EvictionPolicy.touch_all`` must leave every policy exactly as ``touch`` of each key
in turn would, and ``RecencyList``'s batch methods exactly as their per-key loops
would, with held, parked and released keys mixed in. Each case drives two copies with
the same random history, one through the batch path and one key by key (the oracle),
and compares the whole eviction order after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import POLICIES, EvictionPolicy, make_policy
from kvtier.scheduler.policies.recency import RecencyList

KEYS = [BlockHash(bytes([i])) for i in range(12)]


def eviction_order(policy: EvictionPolicy, held: set[BlockHash]) -> list[BlockHash] | None:
    """Every evictable block, in the order the policy would evict them."""
    n = len(policy) - len(held)
    return policy.choose_victims(n, held.__contains__, (), ()) if n > 0 else []


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_touch_all_is_touch_of_each_key_in_turn(name: str, data: st.DataObject) -> None:
    batch, oracle = make_policy(name, 8), make_policy(name, 8)
    resident: list[BlockHash] = []
    held: set[BlockHash] = set()
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        op = data.draw(st.sampled_from(["add", "touch", "hold", "release", "evict"]))
        absent = [k for k in KEYS if k not in resident]
        if op == "add" and absent and len(resident) < 8:
            keys = data.draw(st.lists(st.sampled_from(absent), min_size=1, unique=True))
            keys = keys[: 8 - len(resident)]
            for p in (batch, oracle):
                p.add_all(keys)
            resident += keys
            held.update(keys)  # being stored
        elif op == "touch" and resident:
            keys = data.draw(st.lists(st.sampled_from(resident), min_size=1, max_size=10))
            storing = set(data.draw(st.lists(st.sampled_from(resident)), label="storing"))
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
            n = data.draw(st.integers(1, 3))
            victims = batch.choose_victims(n, held.__contains__, (), ())
            assert victims == oracle.choose_victims(n, held.__contains__, (), ())
            if victims is not None:
                for p in (batch, oracle):
                    p.evict(victims)
                resident = [k for k in resident if k not in victims]
        # Searching parks held blocks at the cold end: both copies, the same way.
        assert eviction_order(batch, held) == eviction_order(oracle, held)
        assert len(batch) == len(oracle) == len(resident)


def order(rl: RecencyList[str], held: set[str]) -> list[str]:
    gen = rl.evictable(held.__contains__, ())
    try:
        return list(gen)
    finally:
        gen.close()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_recency_list_batch_methods_are_their_per_key_loops(data: st.DataObject) -> None:
    names = [str(i) for i in range(10)]
    batch: RecencyList[str] = RecencyList()
    oracle: RecencyList[str] = RecencyList()
    members: set[str] = set()
    held: set[str] = set()
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["add", "touch", "to_end", "discard", "hold", "free"]))
        inside = sorted(members)
        if op == "add":
            keys = data.draw(st.lists(st.sampled_from(names), unique=True))
            keys = [k for k in keys if k not in members]
            batch.add_all(keys)
            for key in keys:
                oracle.add(key)
            members.update(keys)
        elif op == "touch" and inside:
            keys = data.draw(st.lists(st.sampled_from(inside), min_size=1))
            batch.touch_all(keys)
            for key in keys:
                oracle.touch(key)
        elif op == "to_end":
            keys = data.draw(st.lists(st.sampled_from(names)))
            batch.move_all_to_end(keys)
            for key in keys:
                if key in oracle:
                    oracle.touch(key)
                else:
                    oracle.add(key)
            members.update(keys)
        elif op == "discard":
            keys = data.draw(st.lists(st.sampled_from(names), unique=True))
            assert batch.holds_all(keys) == all(k in oracle for k in keys)
            assert batch.remove_found(keys) == [k for k in keys if k not in oracle]
            oracle.remove_all([k for k in keys if k in oracle])
            members.difference_update(keys)
        elif op == "hold" and inside:
            held.update(data.draw(st.lists(st.sampled_from(inside), min_size=1)))
        elif op == "free" and held:
            keys = data.draw(st.lists(st.sampled_from(sorted(held)), min_size=1, unique=True))
            held.difference_update(keys)
            batch.release_all(keys)
            for key in keys:
                oracle.release(key)
        held &= members
        assert order(batch, held) == order(oracle, held)
        assert len(batch) == len(oracle) == len(members)
        assert all(k in batch for k in members)
