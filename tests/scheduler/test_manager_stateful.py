"""Hypothesis state machines: the manager against a plain-dict model, per policy.

The model knows each block's state and pins, and (for LRU) the exact order of use.
After every step: capacity is never exceeded, held slots are distinct, states and
pins agree with the model, ``lookup`` counts only ready blocks, pinned and storing
blocks are never evicted, a ``None`` from ``prepare_store`` changes nothing, and
``prepare_store`` fails only when there really are too few evictable blocks.
"""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.errors import ProtocolError
from kvtier.scheduler import POLICIES, CPUOffloadingManager
from kvtier.scheduler.manager import BlockState

UNIVERSE = [f"k{i}".encode() for i in range(14)]
key_lists = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=6, unique=True)


class ManagerMachine(RuleBasedStateMachine):
    policy = "lru"
    threshold = 0

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 5
        self.m = CPUOffloadingManager(
            num_blocks=self.capacity,
            block_size=4,
            eviction_policy=self.policy,
            enable_events=True,
            store_threshold=self.threshold,
        )
        self.state: dict[bytes, BlockState] = {}
        self.pins: dict[bytes, int] = {}
        self.used: dict[bytes, int] = {}  # key -> time of last use (LRU order)
        self.seen: dict[bytes, int] = {}
        self.clock = itertools.count()
        self.pending: list[tuple[bytes, ...]] = []  # store batches awaiting completion
        self.loads: list[tuple[bytes, ...]] = []  # load batches awaiting completion

    # -- helpers ---------------------------------------------------------------------

    def evictable(self, exclude: set[bytes]) -> list[bytes]:
        return [
            k
            for k, s in self.state.items()
            if s is BlockState.READY and self.pins[k] == 0 and k not in exclude
        ]

    def snapshot(self) -> dict[bytes, tuple[object, object, int]]:
        return {k: (self.m.state(k), self.m.slot(k), self.m.pins(k)) for k in UNIVERSE}

    # -- rules -----------------------------------------------------------------------

    @rule(ks=key_lists)
    def lookup(self, ks: list[bytes]) -> None:
        expect = 0
        for k in ks:
            if self.state.get(k) is not BlockState.READY:
                break
            expect += 1
        assert self.m.lookup(ks) == expect
        for k in ks[expect:]:
            if k not in self.state:
                self.seen[k] = self.seen.get(k, 0) + 1

    @rule(ks=key_lists)
    def touch(self, ks: list[bytes]) -> None:
        self.m.touch(ks)
        for k in reversed(ks):
            if k in self.state:
                self.used[k] = next(self.clock)

    @rule(ks=key_lists)
    def prepare_store(self, ks: list[bytes]) -> None:
        before = self.snapshot()
        events_before = len(self.m._events)
        out = self.m.prepare_store(ks)
        new = [k for k in ks if k not in self.state]
        if self.threshold > 1:
            new = [k for k in new if self.seen.get(k, 0) >= self.threshold]
        need = len(new) - (self.capacity - len(self.state))
        candidates = self.evictable(set(ks))
        if out is None:
            assert need > len(candidates), "refused although enough blocks were evictable"
            assert self.snapshot() == before, "a refused store changed the tier"
            assert len(self.m._events) == events_before
            return
        assert list(out.block_hashes_to_store) == new
        evicted = list(out.block_hashes_evicted)
        assert len(evicted) == max(0, need)
        assert set(evicted) <= set(candidates), "evicted a held or own block"
        if self.policy == "lru":
            by_age = sorted(candidates, key=self.used.__getitem__)
            assert evicted == by_age[: len(evicted)], "LRU did not evict the coldest"
        for k in evicted:
            del self.state[k], self.pins[k], self.used[k]
        for k in new:
            self.state[k] = BlockState.STORING
            self.pins[k] = 0
            self.used[k] = next(self.clock)
            self.seen.pop(k, None)
        if new:
            self.pending.append(tuple(new))

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        batch = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        self.m.complete_store(batch, success=success)
        for k in batch:
            if success:
                self.state[k] = BlockState.READY
            else:
                del self.state[k], self.pins[k], self.used[k]

    @precondition(lambda self: any(s is BlockState.READY for s in self.state.values()))
    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        ready = sorted(k for k, s in self.state.items() if s is BlockState.READY)
        # A key may be listed twice: two pins, the second counted apart (``_more_pins``).
        ks = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=4))
        spec = self.m.prepare_load(ks)
        assert list(spec.block_ids) == [self.m.slot(k) for k in ks]
        for k in ks:
            self.pins[k] += 1
        self.loads.append(tuple(ks))

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        batch = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
        self.m.complete_load(batch)
        for k in batch:
            self.pins[k] -= 1

    @rule(ks=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=4))
    def complete_load_misused(self, ks: list[bytes]) -> None:
        # Unpinning more than is pinned (or an absent block) raises and changes nothing.
        if all(ks.count(k) <= self.pins.get(k, 0) for k in ks):
            return
        before = self.snapshot()
        with pytest.raises(ProtocolError, match="not pinned"):
            self.m.complete_load(ks)
        assert self.snapshot() == before

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        assert len(self.m) == len(self.state) <= self.capacity
        assert self.m.num_free == self.capacity - len(self.state)
        slots = [self.m.slot(k) for k in self.state]
        assert len(set(slots)) == len(slots)
        assert all(s is not None and 0 <= s < self.capacity for s in slots)
        for k in UNIVERSE:
            assert self.m.state(k) is self.state.get(k)
            assert self.m.pins(k) == self.pins.get(k, 0) >= 0
        assert len(self.m.policy) == len(self.state)
        # What a policy is told is held: STORING or pinned, one key or a batch.
        held = self.m._is_held
        assert held.n_pinned == sum(1 for k in self.state if self.pins[k] > 0)
        for k, s in self.state.items():
            assert held(k) is (s is BlockState.STORING or self.pins[k] > 0)
            assert held.any_of([k]) is held(k)
        assert held.any_of(list(self.state)) is any(map(held, self.state))


machine_settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
for _name in sorted(POLICIES):
    for _threshold in (0, 2):
        _cls = type(
            f"ManagerMachine_{_name}_t{_threshold}",
            (ManagerMachine,),
            {"policy": _name, "threshold": _threshold},
        )
        globals()[f"Test_{_name}_threshold{_threshold}"] = machine_settings(_cls).TestCase
