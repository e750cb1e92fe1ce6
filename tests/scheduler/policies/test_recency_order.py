"""``RecencyList`` behaves as an ``OrderedDict`` of keys in LRU order (the model).

A state machine drives two lists (``transfer`` moves keys between them) through
every operation -- adds, touches (one, a batch with repeats, ``touch_listed``,
``move_all_to_end``), removals (``remove``, ``remove_found``), the
manager's store (``coldest`` then ``remove_found`` of its answer) -- with holds and
releases so keys get parked, and compares after every step the whole order (parked
keys first, as they are the coldest), the victims ``coldest`` picks, ``first`` and
``first_n``, and membership with the model. Few keys, so each is touched, parked,
removed and re-added often.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

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

    @precondition(lambda self: any(self.models))
    @invariant()
    def coldest_of_all_evictable_is_the_model_order(self) -> None:
        for rl, model in zip(self.lists, self.models, strict=True):
            free = [k for k in model if k not in self.held]
            if free:
                assert rl.coldest(len(free), self.held.__contains__, ()) == free
            assert rl.coldest(len(free) + 1, self.held.__contains__, ()) is None


TestRecencyOrder = RecencyMachine.TestCase
TestRecencyOrder.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


def test_keys_chosen_then_touched_are_removed_from_where_they_are_now() -> None:
    """A key ``coldest`` chose and touched before its removal is removed from where
    the touch put it (the queue version of the list once took the chosen front
    entries as they were, leaving the touched key's new entry behind)."""
    rl: RecencyList[str] = RecencyList()
    rl.add_all(["a", "b", "c"])
    victims = rl.coldest(2, frozenset().__contains__, ())
    assert victims == ["a", "b"]
    rl.touch("b")
    assert rl.remove_found(victims) == []
    assert rl.ordered() == ["c"] and "b" not in rl and len(rl) == 1
    rl.add("b")
    assert rl.ordered() == ["c", "b"]
