"""Every batch path is its per-key loop, on long seeded histories and any ``storing``.

``test_batch_paths.py`` checks ``touch_all`` under Hypothesis with ``storing`` a set.
Here each policy is driven twice through long seeded random histories -- stores of
returning ghosts, touches with ``storing`` a set, a frozenset, a list or a tuple,
pins, evictions of victims from several lists, failed stores -- once through the
batch methods (``add_all``, ``touch_all``, ``evict`` of many, ``remove_all``) and once
key by key (the oracle), comparing the whole eviction order after every step. The
same for ``RecencyList``'s ``remove_found``, ``members`` and ``first_n`` against plain
lists. Deterministic, so that each case runs whole under the mutation profile too.
"""

from __future__ import annotations

import random
from collections.abc import Collection

import pytest

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import POLICIES, AdaptivePolicy, EvictionPolicy, make_policy
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy


def _k(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def _order(policy: EvictionPolicy, held: set[BlockHash]) -> list[BlockHash] | None:
    n = len(policy) - len(held)
    return policy.choose_victims(n, held.__contains__, (), ()) if n > 0 else []


def _storing(rng: random.Random, resident: list[BlockHash]) -> Collection[BlockHash]:
    chosen = [key for key in resident if rng.random() < 0.2]
    return rng.choice([set, frozenset, list, tuple])(chosen)  # type: ignore[no-any-return]


def _make(name: str, capacity: int) -> EvictionPolicy:
    """A registered policy; ``adaptive@0`` is adaptive after a decision for share 0
    (its lists then compete by last use, so every add and touch must set it)."""
    if name == "adaptive@0":
        policy = AdaptivePolicy(capacity)
        policy._share_cap = 0
        return policy
    return make_policy(name, capacity)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", [*sorted(POLICIES), "adaptive@0"])
def test_batch_methods_are_their_per_key_loops(name: str, seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([3, 5, 8])
    batch, oracle = _make(name, capacity), _make(name, capacity)
    resident: list[BlockHash] = []
    held: set[BlockHash] = set()
    pool = [_k(i) for i in range(3 * capacity)]
    for step in range(250):
        op = rng.choice(["add", "add", "touch", "touch", "evict", "hold", "free", "fail"])
        if op == "add":
            absent = [key for key in pool if key not in resident]
            keys = rng.sample(absent, min(len(absent), rng.randint(1, 4)))
            keys = keys[: capacity - len(resident)]
            batch.add_all(keys)
            for key in keys:
                oracle.add(key)
            resident += keys
        elif op == "touch" and resident:
            keys = [rng.choice(resident) for _ in range(rng.randint(1, 6))]
            storing = _storing(rng, resident)
            batch.touch_all(keys, storing)
            for key in keys:
                oracle.touch(key, key not in storing)
        elif op == "evict" and resident:
            n = rng.randint(1, max(1, len(resident) - len(held)))
            victims = batch.choose_victims(n, held.__contains__, (), ())
            assert victims == oracle.choose_victims(n, held.__contains__, (), ())
            if victims is not None:
                batch.evict(victims)
                for key in victims:
                    oracle.evict([key])
                resident = [key for key in resident if key not in victims]
        elif op == "hold" and resident:
            held.update(rng.sample(resident, rng.randint(1, len(resident))))
        elif op == "free" and held:
            keys = rng.sample(sorted(held), rng.randint(1, len(held)))
            held.difference_update(keys)
            batch.release_all(keys)
            for key in keys:
                oracle.release(key)
        elif op == "fail" and resident and isinstance(batch, SegmentedPolicy):
            keys = rng.sample(resident, rng.randint(1, len(resident)))
            batch.remove_all(keys)
            for key in keys:
                oracle.remove(key)
            resident = [key for key in resident if key not in keys]
            held.difference_update(keys)
        assert _order(batch, held) == _order(oracle, held), (step, op)
        assert len(batch) == len(oracle) == len(resident)


@pytest.mark.parametrize(
    "name", sorted(n for n, cls in POLICIES.items() if issubclass(cls, SegmentedPolicy))
)
def test_remove_all_of_a_key_that_is_not_there_names_it(name: str) -> None:
    policy = make_policy(name, 4)
    assert isinstance(policy, SegmentedPolicy)
    policy.add_all([_k(1), _k(2)])
    with pytest.raises(KeyError) as caught:
        policy.remove_all([_k(1), _k(9)])
    assert caught.value.args == (_k(9),)


def _plain(rl: RecencyList[str], held: set[str]) -> list[str]:
    gen = rl.evictable(held.__contains__, ())
    try:
        return list(gen)
    finally:
        gen.close()


@pytest.mark.parametrize("seed", range(8))
def test_recency_list_lookups_and_removals_match_a_plain_list(seed: int) -> None:
    rng = random.Random(seed)
    names = [str(i) for i in range(12)]
    rl: RecencyList[str] = RecencyList()
    held: set[str] = set()
    for _ in range(200):
        op = rng.choice(["add", "touch", "hold", "free", "search", "remove"])
        inside = rl.ordered()
        if op == "add":
            keys = [key for key in rng.sample(names, rng.randint(1, 4)) if key not in rl]
            rl.add_all(keys)
        elif op == "touch" and inside:
            rl.touch_all([rng.choice(inside) for _ in range(rng.randint(1, 4))])
        elif op == "hold" and inside:
            held.update(rng.sample(inside, rng.randint(1, len(inside))))
        elif op == "free" and held:
            keys = rng.sample(sorted(held), rng.randint(1, len(held)))
            held.difference_update(keys)
            rl.release_all(keys)
        elif op == "search":
            _plain(rl, held)  # parks the held run at the cold end
        elif op == "remove":
            keys = rng.sample(names, rng.randint(1, 6))  # distinct; some not in the list
            before = rl.ordered()
            assert rl.members(keys) == [key for key in keys if key in before]
            assert rl.remove_found(keys) == [key for key in keys if key not in before]
            assert rl.ordered() == [key for key in before if key not in keys]
            held.difference_update(keys)
        everything = rl.ordered()
        for n in (0, 1, 3, len(everything), len(everything) + 2):
            assert rl.first_n(n) == everything[:n]
        assert _plain(rl, held) == [key for key in rl.ordered() if key not in held]
