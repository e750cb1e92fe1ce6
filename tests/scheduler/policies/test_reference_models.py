"""Every policy against its reference model (``models.py``), step by step.

Two levels, both under Hypothesis on random key sequences over a small key space (so
that blocks come back, ghosts return and lists overflow often):

* the policy alone, driven the way the manager drives it -- batched stores with their
  own keys protected, stores completing or failing, load pins, touches of stored and
  storing blocks, lookups (``observe``: a learning policy may move pinned and parked
  blocks between its lists) -- asking for victims after every step: the same victims in the same
  order, the same list sizes (and ARC's ``p``);
* the real ``TierManager`` over the fast policy beside one over the model, on random
  requests: the same hits, the same evicted blocks, and manager counters equal to
  ones counted here by hand.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash, Medium
from kvtier.scheduler import POLICIES
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import make_policy
from kvtier.scheduler.policies.base import EvictionPolicy
from tests.budget import examples

from .models import MODELS

KEYS = 16  # more than twice the largest capacity: ghost lists fill and overflow


def k(i: int) -> BlockHash:
    return BlockHash(f"k{i}".encode())


# ``adaptive`` follows the winner of shadow caches chosen online; it is checked against
# its own plain model, frozen at each share, in test_adaptive.py.
OWN_MODEL = {"adaptive"}


def test_every_registered_policy_has_a_reference_model() -> None:
    assert set(MODELS) | OWN_MODEL == set(POLICIES)
    assert not set(MODELS) & OWN_MODEL


key_ids = st.integers(0, KEYS - 1)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.lists(key_ids, min_size=1, max_size=4)),
        st.tuples(st.just("done"), key_ids, st.booleans()),
        st.tuples(st.just("pin"), key_ids),
        st.tuples(st.just("unpin"), key_ids),
        st.tuples(st.just("touch"), st.lists(key_ids, min_size=1, max_size=4)),
        st.tuples(st.just("probe"), st.integers(1, 4), st.lists(key_ids, max_size=3)),
        st.tuples(st.just("lookup"), st.lists(key_ids, min_size=1, max_size=5)),
    ),
    max_size=120,
)


def _shape(policy: EvictionPolicy) -> object:
    return (len(policy), getattr(policy, "sizes", None), getattr(policy, "p", None))


class _Twin:
    """A fast policy and its model, fed the same calls; every answer compared."""

    def __init__(self, name: str, capacity: int) -> None:
        self.capacity = capacity
        self.real = make_policy(name, capacity)
        self.model = MODELS[name](capacity)
        self.resident: set[BlockHash] = set()
        self.storing: set[BlockHash] = set()
        self.pins: dict[BlockHash, int] = {}

    def is_held(self, key: BlockHash) -> bool:
        return key in self.storing or self.pins.get(key, 0) > 0

    def victims(
        self, n: int, protected: set[BlockHash], incoming: list[BlockHash]
    ) -> list[BlockHash] | None:
        want = self.model.choose_victims(n, self.is_held, protected, incoming)
        got = self.real.choose_victims(n, self.is_held, protected, incoming)
        assert got == want, f"victims of {n} (incoming {incoming}): {got} != model {want}"
        return got

    def store(self, ids: list[int]) -> None:
        batch = [k(i) for i in dict.fromkeys(ids)]
        to_store = [key for key in batch if key not in self.resident]
        if not to_store:
            return
        need = len(self.resident) + len(to_store) - self.capacity
        if need > 0:
            victims = self.victims(need, set(batch), to_store)
            if victims is None:
                return
            self.real.evict(victims)
            self.model.evict(victims)
            self.resident.difference_update(victims)
        self.real.add_all(to_store)
        for key in to_store:
            self.model.add(key)
        self.resident.update(to_store)
        self.storing.update(to_store)

    def done(self, i: int, ok: bool) -> None:
        key = k(i)
        if key not in self.storing:
            return
        self.storing.discard(key)
        if ok:
            self.real.release(key)
            self.model.release(key)
        else:
            self.real.remove(key)
            self.model.remove(key)
            self.resident.discard(key)

    def pin(self, i: int) -> None:
        key = k(i)
        if key in self.resident and key not in self.storing:
            self.pins[key] = self.pins.get(key, 0) + 1

    def unpin(self, i: int) -> None:
        key = k(i)
        if self.pins.get(key, 0) > 0:
            self.pins[key] -= 1
            if self.pins[key] == 0:
                self.real.release_all([key])
                self.model.release(key)

    def touch(self, ids: list[int]) -> None:
        for i in reversed(ids):  # as the manager does: the first key ends most recent
            key = k(i)
            if key not in self.resident:
                continue  # the manager touches resident blocks only
            reused = key not in self.storing
            self.real.touch(key, reused)
            self.model.touch(key, reused)

    def lookup(self, ids: list[int]) -> None:
        """A request looked up (a learning policy may reorder its blocks, pinned ones
        and parked ones too)."""
        keys = [k(i) for i in dict.fromkeys(ids)]
        self.real.observe(keys)
        self.model.observe(keys)

    def probe(self, n: int, incoming: list[int]) -> None:
        before = _shape(self.real)
        self.victims(n, set(), [k(i) for i in incoming if k(i) not in self.resident])
        assert _shape(self.real) == before, "choose_victims changed the policy"


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(capacity=st.integers(1, 6), steps=ops)
def test_policy_matches_its_model_step_by_step(
    name: str, capacity: int, steps: list[tuple[object, ...]]
) -> None:
    twin = _Twin(name, capacity)
    for op, *args in steps:
        getattr(twin, str(op))(*args)
        assert _shape(twin.real) == _shape(twin.model), f"after {op}{tuple(args)}"
        # After every step, the full eviction order must agree too.
        twin.victims(1, set(), [])
        twin.victims(len(twin.resident) or 1, set(), [])


requests = st.lists(
    st.tuples(st.lists(key_ids, min_size=1, max_size=5), st.booleans(), st.booleans()),
    max_size=40,
)


def _manager(policy: EvictionPolicy, capacity: int) -> TierManager:
    return TierManager(medium=Medium.CPU, num_blocks=capacity, block_size=16, policy=policy)


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(capacity=st.integers(1, 8), reqs=requests)
def test_manager_over_policy_matches_manager_over_model(
    name: str, capacity: int, reqs: list[tuple[list[int], bool, bool]]
) -> None:
    """Requests as an engine makes them: look up, pin the hits while the rest is
    stored, store the misses (sometimes failing), unpin; counters counted by hand."""
    real = _manager(make_policy(name, capacity), capacity)
    model = _manager(MODELS[name](capacity), capacity)
    count = dict.fromkeys(
        ("lookups", "lookup_blocks", "hit_blocks", "loads", "stores", "stored"), 0
    )
    count |= dict.fromkeys(("store_failures", "stores_rejected", "evictions"), 0)
    resident: set[BlockHash] = set()
    for ids, load, ok in reqs:
        keys = [k(i) for i in dict.fromkeys(ids)]
        hits = [m.lookup(keys) for m in (real, model)]
        assert hits[0] == hits[1]
        hit = hits[0]
        count["lookups"] += 1
        count["lookup_blocks"] += len(keys)
        count["hit_blocks"] += hit
        for m in (real, model):
            m.touch(keys)
        pinned = keys[:hit] if load else []
        if pinned:
            for m in (real, model):
                m.prepare_load(pinned)
            count["loads"] += len(pinned)
        outs = [m.prepare_store(keys[hit:]) for m in (real, model)]
        assert outs[0] == outs[1]
        out = outs[0]
        if out is None:
            count["stores_rejected"] += len([key for key in keys[hit:] if key not in resident])
        else:
            resident.difference_update(out.block_hashes_evicted)
            if ok:
                resident.update(out.block_hashes_to_store)
            count["stores"] += len(out.block_hashes_to_store)
            count["evictions"] += len(out.block_hashes_evicted)
            count["stored" if ok else "store_failures"] += len(out.block_hashes_to_store)
            for m in (real, model):
                m.touch(keys)
                m.complete_store(out.block_hashes_to_store, success=ok)
        for m in (real, model):
            if pinned:
                m.complete_load(pinned)
    for m in (real, model):
        stats = m.stats()
        assert {name: getattr(stats, name) for name in count} == count


def _scan_then_reuse(policy: Callable[[int], EvictionPolicy]) -> list[int]:
    """Hits of a sequence worked through by hand (capacity 4, the replay flow)."""
    m = _manager(policy(4), 4)
    hits = []
    for ids in ([1, 2], [1, 2], [3], [4], [5], [6], [1, 2], [3, 4], [1], [7, 8, 9], [2]):
        keys = [k(i) for i in ids]
        hits.append(m.lookup(keys))
        m.touch(keys)
        out = m.prepare_store(keys[hits[-1] :])
        m.touch(keys)
        if out is not None:
            m.complete_store(out.block_hashes_to_store)
    return hits


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # LRU: the scan 3..6 flushes 1 and 2; 1 survives [3, 4] only as the warmest.
        ("lru", [0, 2, 0, 0, 0, 0, 0, 0, 1, 0, 0]),
        # ARC: 1 and 2 sit in T2 through the scan; the B1 ghosts 3 and 4 push p to 2,
        # so storing them takes 2 and 1 from T2 (p = 2 is not below |T1| = 2).
        ("arc", [0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0]),
        # SLRU: 1 and 2 are protected; ghosts 3 and 4 return protected and demote 2.
        ("slru", [0, 2, 0, 0, 0, 0, 2, 0, 1, 0, 0]),
    ],
)
def test_a_short_scan_by_hand(name: str, expected: list[int]) -> None:
    assert _scan_then_reuse(MODELS[name]) == expected
    assert _scan_then_reuse(lambda c: make_policy(name, c)) == expected


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("capacity", [2, 3, 5])
def test_a_long_fixed_sequence_matches_the_model(name: str, capacity: int) -> None:
    """Thousands of seeded steps, whatever the Hypothesis profile: the ghost bounds
    (``2c`` for ARC, ``4c`` for SLRU) are reached and trimmed many times."""
    rng = random.Random(capacity)
    twin = _Twin(name, capacity)
    for _ in range(3000):
        op = rng.choice(["store", "store", "done", "done", "pin", "unpin", "touch", "probe"])
        if op in ("store", "touch"):
            getattr(twin, op)([rng.randrange(4 * capacity) for _ in range(rng.randint(1, 3))])
        elif op == "done":
            twin.done(rng.randrange(4 * capacity), rng.random() < 0.9)
        elif op == "probe":
            twin.probe(rng.randint(1, capacity), [rng.randrange(4 * capacity)])
        else:
            getattr(twin, op)(rng.randrange(4 * capacity))
        assert _shape(twin.real) == _shape(twin.model)
