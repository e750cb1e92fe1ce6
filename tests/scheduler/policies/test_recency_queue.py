"""``RecencyList`` behaves as an ``OrderedDict`` of keys in LRU order (the model).

The list keeps its order as a queue of entries with dead ones skipped (a touched or
removed key leaves its old entry behind), so its plausible bugs are a dead entry read
as live (a removed key resurrected, a touched key in its old place), a live one read
as dead, a key lost or doubled when the queue is rebuilt, and the fast paths (the
front taken by ``remove_found``, ``coldest``'s slice) misjudging which entries are
live. A state machine drives two lists (``transfer`` moves keys between them) through
every operation, with holds and releases so keys get parked, and compares after every
step the whole order (parked keys first, as they are the coldest), the victims
``coldest`` picks, ``first``/``first_n``, membership and the queue's own accounting
with the model. Few keys, so each is touched, removed and re-added while its dead
entries are still queued; variants rebuild the queue after every few dead entries and
start the ring at two slots so it wraps and grows.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.scheduler.policies import recency, ring
from kvtier.scheduler.policies.recency import RecencyList

NAMES = [f"k{i}" for i in range(8)]
KEYS = st.sampled_from(NAMES)
SIDE = st.sampled_from([0, 1])


class RecencyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lists: list[RecencyList[str]] = [RecencyList(), RecencyList()]
        self.models: list[OrderedDict[str, None]] = [OrderedDict(), OrderedDict()]
        self.held: set[str] = set()
        self.most = 0

    # -- helpers -------------------------------------------------------------------

    def owner(self, key: str) -> int | None:
        for side, model in enumerate(self.models):
            if key in model:
                return side
        return None

    def absent(self, keys: list[str]) -> list[str]:
        return [k for k in dict.fromkeys(keys) if self.owner(k) is None]

    def touch_model(self, side: int, key: str) -> None:
        self.models[side].move_to_end(key)

    # -- adding --------------------------------------------------------------------

    @rule(side=SIDE, key=KEYS)
    def add(self, side: int, key: str) -> None:
        if self.owner(key) is None:
            self.lists[side].add(key)
            self.models[side][key] = None

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=5))
    def add_all(self, side: int, keys: list[str]) -> None:
        keys = self.absent(keys)
        self.lists[side].add_all(keys)
        self.models[side].update(dict.fromkeys(keys))

    # -- touching ------------------------------------------------------------------

    @rule(side=SIDE, key=KEYS)
    def touch(self, side: int, key: str) -> None:
        if key in self.models[side]:
            self.lists[side].touch(key)
            self.touch_model(side, key)

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=6))
    def touch_all(self, side: int, keys: list[str]) -> None:
        keys = [k for k in keys if k in self.models[side]]  # repeats kept
        self.lists[side].touch_all(keys)
        for key in keys:
            self.touch_model(side, key)

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=6))
    def touch_listed(self, side: int, keys: list[str]) -> None:
        rl, model = self.lists[side], self.models[side]
        expected = 0  # the leading keys in the list and not parked
        for key in keys:
            if key not in model or key in rl._parked:
                break
            expected += 1
        assert rl.touch_listed(keys) == expected
        for key in keys[:expected]:
            self.touch_model(side, key)

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=6))
    def move_all_to_end(self, side: int, keys: list[str]) -> None:
        other = self.models[1 - side]
        keys = [k for k in keys if k not in other]  # in this list or new; repeats kept
        self.lists[side].move_all_to_end(keys)
        model = self.models[side]
        for key in keys:
            model[key] = None
            model.move_to_end(key)

    # -- removing ------------------------------------------------------------------

    @rule(side=SIDE, key=KEYS)
    def remove(self, side: int, key: str) -> None:
        if key in self.models[side]:
            self.lists[side].remove(key)
            del self.models[side][key]

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=6))
    def discard_all(self, side: int, keys: list[str]) -> None:
        self.lists[side].discard_all(keys)
        for key in keys:
            self.models[side].pop(key, None)

    @rule(side=SIDE, keys=st.lists(KEYS, max_size=6, unique=True))
    def remove_found(self, side: int, keys: list[str]) -> None:
        model = self.models[side]
        others = [k for k in keys if k not in model]
        assert self.lists[side].remove_found(keys) == others
        for key in keys:
            model.pop(key, None)

    @rule(side=SIDE, data=st.data())
    def evict(self, side: int, data: st.DataObject) -> None:
        """``coldest`` then ``remove_found`` of its answer: the manager's store."""
        rl, model = self.lists[side], self.models[side]
        n = data.draw(st.integers(1, 4), label="n")
        protected = set(data.draw(st.lists(KEYS, max_size=2), label="protected"))
        free = [k for k in model if k not in self.held and k not in protected]
        victims = rl.coldest(n, self.held.__contains__, protected)
        assert victims == (free[:n] if len(free) >= n else None)
        if victims is not None:
            assert rl.remove_found(victims) == []
            for key in victims:
                del model[key]

    @rule(data=st.data())
    def transfer(self, data: st.DataObject) -> None:
        side = data.draw(SIDE, label="from")
        model = self.models[side]
        if model:
            keys = data.draw(st.lists(st.sampled_from(list(model)), unique=True), label="keys")
            self.lists[side].transfer(keys, self.lists[1 - side])
            for key in keys:
                del model[key]
                self.models[1 - side][key] = None

    # -- holding -------------------------------------------------------------------

    @rule(key=KEYS)
    def hold(self, key: str) -> None:
        self.held.add(key)

    @rule(key=KEYS)
    def release(self, key: str) -> None:
        if key in self.held:
            self.held.discard(key)
            side = self.owner(key)
            if side is not None:
                self.lists[side].release(key)

    @rule(keys=st.lists(KEYS, max_size=4, unique=True))
    def release_all(self, keys: list[str]) -> None:
        keys = [k for k in keys if k in self.held]
        self.held.difference_update(keys)
        for rl in self.lists:
            rl.release_all(keys)

    # -- checks --------------------------------------------------------------------

    @invariant()
    def same_order_and_members(self) -> None:
        for rl, model in zip(self.lists, self.models, strict=True):
            assert rl.ordered() == list(model)
            assert len(rl) == len(model)
            assert sorted(rl.keys()) == sorted(model)
            for key in NAMES:
                assert (key in rl) == (key in model)
            for n in range(len(model) + 2):
                assert rl.first_n(n) == list(model)[:n]
            if model:
                assert rl.first() == next(iter(model))

    @invariant()
    def the_queue_holds_each_live_key_last_and_counts_the_dead(self) -> None:
        for rl in self.lists:
            entries = list(rl._queue)
            assert len(entries) == len(rl._queue)
            dead = sum(rl._stale.values())
            assert len(entries) == len(rl._live) + dead
            assert all(n > 0 for n in rl._stale.values())
            for key in set(entries):  # a key's dead entries, then its live one
                assert entries.count(key) == rl._stale[key] + (key in rl._live)
            assert set(rl._live).isdisjoint(rl._parked)
            self.most = max(self.most, len(rl._live))
            assert dead <= self.most + recency.COMPACT_SLACK  # rebuilt past that

    @precondition(lambda self: any(self.models))
    @invariant()
    def coldest_of_all_evictable_is_the_model_order(self) -> None:
        for rl, model in zip(self.lists, self.models, strict=True):
            free = [k for k in model if k not in self.held]
            if free:
                assert rl.coldest(len(free), self.held.__contains__, ()) == free
            assert rl.coldest(len(free) + 1, self.held.__contains__, ()) is None


class EagerRebuildMachine(RecencyMachine):
    """The same with the queue rebuilt once dead entries pass the live ones by two."""

    def __init__(self) -> None:
        self._slack = recency.COMPACT_SLACK
        recency.COMPACT_SLACK = 2
        super().__init__()

    def teardown(self) -> None:
        recency.COMPACT_SLACK = self._slack


class SmallRingMachine(RecencyMachine):
    """The same in rings of two slots at first, so that they wrap and grow often."""

    def __init__(self) -> None:
        self._min_ring = ring.MIN_RING
        ring.MIN_RING = 2
        super().__init__()

    def teardown(self) -> None:
        ring.MIN_RING = self._min_ring


SETTINGS = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestRecencyQueue = RecencyMachine.TestCase
TestRecencyQueue.settings = SETTINGS
TestRecencyQueueRebuilds = EagerRebuildMachine.TestCase
TestRecencyQueueRebuilds.settings = SETTINGS
TestRecencyQueueSmallRing = SmallRingMachine.TestCase
TestRecencyQueueSmallRing.settings = SETTINGS


def test_keys_chosen_then_touched_are_removed_from_where_they_are_now() -> None:
    """``coldest`` vouches for the front entries it returns so that ``remove_found``
    of that very list need not check them again; a touch in between kills one of
    them, and the removal must then find the key's live entry, not take the dead one
    off the front (which would leave the live entry behind: the key resurrected)."""
    rl: RecencyList[str] = RecencyList()
    rl.add_all(["a", "b", "c"])
    victims = rl.coldest(2, frozenset().__contains__, ())
    assert victims == ["a", "b"]
    rl.touch("b")  # b's front entry is dead now; its live one is last
    assert rl.remove_found(victims) == []
    assert rl.ordered() == ["c"] and "b" not in rl and len(rl) == 1
    rl.add("b")
    assert rl.ordered() == ["c", "b"]
