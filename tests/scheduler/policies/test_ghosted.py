"""``GhostedList`` behaves as an LRU ``OrderedDict`` beside a FIFO ``OrderedDict`` of
ghosts (the model).

A state machine drives one list and its ghosts through every operation -- adds (of
new keys, of ghosts, which leave the ghosts, and of demoted keys with their values),
touches, removals, ``bury`` of the victims ``coldest`` picks (the manager's store
under ARC) and of any keys (others made ghosts too, as segmented LRU's), ghost
updates, discards and drops of the oldest -- with holds and releases so keys get
parked and released, and compares after every step the whole order (parked keys
first: they are the coldest), the ghosts in order, the victims ``coldest`` picks,
membership and sizes, and that the dead entries of both queues are counted and
bounded. Few keys, so each is touched, parked, evicted, returned and dropped often;
variants rebuild the queues after two dead entries and start from rings of two slots.
"""

from __future__ import annotations

from collections import OrderedDict
from copy import deepcopy
from itertools import count

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvtier.scheduler.policies import entries
from kvtier.scheduler.policies.entries import EntryQueue
from kvtier.scheduler.policies.ghosted import GhostedList
from kvtier.scheduler.policies.timed import TimedGhostedList

NAMES = [f"k{i}" for i in range(8)]
KEYS = st.sampled_from(NAMES)


class GhostedMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.gl: GhostedList[str] = GhostedList()
        self.model: OrderedDict[str, None] = OrderedDict()  # the list, coldest first
        self.ghosts: OrderedDict[str, None] = OrderedDict()  # oldest first
        self.held: set[str] = set()

    # -- the list ------------------------------------------------------------------

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        if key not in self.model:
            self.gl.add(key)
            self.ghosts.pop(key, None)
            self.model[key] = None

    @rule(keys=st.lists(KEYS, max_size=5, unique=True))
    def add_all(self, keys: list[str]) -> None:
        keys = [k for k in keys if k not in self.model and k not in self.ghosts]
        self.gl.add_all(keys)
        self.model.update(dict.fromkeys(keys))

    @rule(keys=st.lists(KEYS, max_size=5, unique=True))
    def take_in(self, keys: list[str]) -> None:
        """A demotion from another list: each key with its value."""
        keys = [k for k in keys if k not in self.model and k not in self.ghosts]
        self.gl.take_in(keys, [True] * len(keys))
        self.model.update(dict.fromkeys(keys))

    @rule(key=KEYS)
    def touch(self, key: str) -> None:
        if key in self.model:
            self.gl.touch(key)
            self.model.move_to_end(key)

    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        if key in self.model:
            self.gl.remove(key)
            del self.model[key]

    @rule(keys=st.lists(KEYS, max_size=6))
    def discard_all(self, keys: list[str]) -> None:
        self.gl.discard_all(keys)
        for key in keys:
            self.model.pop(key, None)

    @rule(keys=st.lists(KEYS, max_size=6, unique=True))
    def remove_found(self, keys: list[str]) -> None:
        others = [k for k in keys if k not in self.model]
        assert self.gl.remove_found(keys) == others
        for key in keys:
            self.model.pop(key, None)

    def _bury_model(self, victims: list[str]) -> list[str]:
        others = [k for k in victims if k not in self.model]
        for key in victims:
            if key in self.model:
                del self.model[key]
                self.ghosts[key] = None
        return others

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """``coldest`` then ``bury`` of its answer: ARC's store."""
        n = data.draw(st.integers(1, 4), label="n")
        protected = set(data.draw(st.lists(KEYS, max_size=2), label="protected"))
        free = [k for k in self.model if k not in self.held and k not in protected]
        victims = self.gl.coldest(n, self.held.__contains__, protected)
        assert victims == (free[:n] if len(free) >= n else None)
        if victims is not None:
            assert self.gl.bury(victims) == []
            self._bury_model(victims)

    @rule(keys=st.lists(KEYS, max_size=5, unique=True), all_ghosts=st.booleans())
    def bury(self, keys: list[str], all_ghosts: bool) -> None:
        """Any keys, in any order: the list's become ghosts, the others come back
        (and become ghosts too, in their places, with ``all_ghosts``)."""
        keys = [k for k in keys if k not in self.ghosts]  # a victim is never a ghost
        expected = [k for k in keys if k not in self.model]
        assert self.gl.bury(keys, all_ghosts=all_ghosts) == expected
        for key in keys:
            if all_ghosts or key in self.model:
                self.model.pop(key, None)
                self.ghosts[key] = None

    @rule(keys=st.lists(KEYS, max_size=6))
    def members_then_remove_all(self, keys: list[str]) -> None:
        found = [k for k in keys if k in self.model]
        assert self.gl.members(iter(keys)) == found
        unique = list(dict.fromkeys(found))
        self.gl.remove_all(unique)
        for key in unique:
            del self.model[key]

    # -- holding -------------------------------------------------------------------

    @rule(key=KEYS)
    def hold(self, key: str) -> None:
        self.held.add(key)

    @rule(key=KEYS)
    def release(self, key: str) -> None:
        if key in self.held:
            self.held.discard(key)
            if key in self.model:
                self.gl.release(key)

    @rule(keys=st.lists(KEYS, max_size=4, unique=True))
    def release_all(self, keys: list[str]) -> None:
        keys = [k for k in keys if k in self.held]
        self.held.difference_update(keys)
        self.gl.release_all(keys)

    # -- the ghosts ------------------------------------------------------------------

    @rule(keys=st.lists(KEYS, max_size=4, unique=True))
    def ghost_update(self, keys: list[str]) -> None:
        keys = [k for k in keys if k not in self.model and k not in self.ghosts]
        self.gl.ghosts.update(iter(keys))
        self.ghosts.update(dict.fromkeys(keys))

    @rule(key=KEYS)
    def ghost_discard(self, key: str) -> None:
        self.gl.ghosts.discard(key)
        self.ghosts.pop(key, None)

    @rule(data=st.data())
    def ghost_pop_oldest(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(-1, len(self.ghosts)), label="n")
        self.gl.ghosts.pop_oldest(n)
        for _ in range(n):
            self.ghosts.popitem(last=False)

    # -- checks --------------------------------------------------------------------

    @invariant()
    def same_order_ghosts_and_members(self) -> None:
        gl, model, ghosts = self.gl, self.model, self.ghosts
        assert gl.ordered() == list(model)
        assert list(gl.ghosts) == list(ghosts)
        assert len(gl) == len(model) and len(gl.ghosts) == len(ghosts)
        assert sorted(gl.keys()) == sorted(model)
        for key in NAMES:
            assert (key in gl) == (key in model)
            assert (key in gl.ghosts) == (key in ghosts)
            assert gl.ghosts.isdisjoint([key]) == (key not in ghosts)
            assert gl.ghosts.isdisjoint(iter([key])) == (key not in ghosts)

    @invariant()
    def coldest_of_all_evictable_is_the_model_order(self) -> None:
        free = [k for k in self.model if k not in self.held]
        if free:
            assert self.gl.coldest(len(free), self.held.__contains__, ()) == free
        assert self.gl.coldest(len(free) + 1, self.held.__contains__, ()) is None

    @invariant()
    def dead_entries_are_counted_and_bounded(self) -> None:
        queues: tuple[EntryQueue[str], EntryQueue[str]] = (self.gl._order, self.gl._ghosts)
        live = (len(self.model) - len(self.gl._parked), len(self.ghosts))
        # A rebuild comes with a kill; between kills, taking live entries from the
        # front lowers the live count: dead ones stay within the most live since.
        self.most = [max(m, n) for m, n in zip(getattr(self, "most", live), live, strict=True)]
        for queue, n_live, most in zip(queues, live, self.most, strict=True):
            dead = sum(queue._dead.values())
            assert dead == queue._n_dead and all(queue._dead.values())
            assert len(list(queue.entries())) == queue._size == n_live + dead
            assert len(queue) == n_live
            assert 0 <= queue._head < len(queue._ring) and queue._size <= len(queue._ring)
            assert sum(k is None for k in queue._ring) == len(queue._ring) - queue._size
            assert dead <= most + entries.COMPACT_SLACK  # rebuilt past that


class SmallSlackGhostedMachine(GhostedMachine):
    """The same with a rebuild after two dead entries, so rebuilds happen often."""

    def __init__(self) -> None:
        super().__init__()
        self._slack = entries.COMPACT_SLACK
        entries.COMPACT_SLACK = 2

    def teardown(self) -> None:
        entries.COMPACT_SLACK = self._slack


class SmallRingGhostedMachine(GhostedMachine):
    """The same in rings of two slots at first, so that they wrap and grow often."""

    def __init__(self) -> None:
        self._min_ring = entries.MIN_RING
        entries.MIN_RING = 2
        super().__init__()

    def teardown(self) -> None:
        entries.MIN_RING = self._min_ring


_SETTINGS = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestGhostedList = GhostedMachine.TestCase
TestGhostedList.settings = _SETTINGS
TestGhostedListRebuilds = SmallSlackGhostedMachine.TestCase
TestGhostedListRebuilds.settings = _SETTINGS
TestGhostedListSmallRing = SmallRingGhostedMachine.TestCase
TestGhostedListSmallRing.settings = _SETTINGS


def test_a_victim_touched_after_it_was_chosen_is_buried_from_where_it_is_now() -> None:
    """``coldest`` chose two keys, one was touched before ``bury``: the front entries
    no longer are the victims, and each is buried from where it is."""
    gl: GhostedList[str] = GhostedList()
    gl.add_all(["a", "b", "c"])
    victims = gl.coldest(2, frozenset().__contains__, ())
    assert victims == ["a", "b"]
    gl.touch("b")
    assert gl.bury(victims) == []
    assert gl.ordered() == ["c"] and list(gl.ghosts) == ["a", "b"]
    gl.add("b")  # a returning ghost
    assert gl.ordered() == ["c", "b"] and list(gl.ghosts) == ["a"]


def test_a_key_listed_before_its_dead_entry_reaches_the_front_is_read_once() -> None:
    """A key removed and added again has a dead entry ahead of its live one: the front
    (``coldest``'s slice) must not take the dead one for it."""
    gl: GhostedList[str] = GhostedList()
    gl.add_all(["a", "b"])
    gl.remove("b")
    gl.add("b")
    gl.add("c")
    assert gl.coldest(2, frozenset().__contains__, ()) == ["a", "b"]
    assert gl.bury(["a", "b"]) == []
    assert gl.ordered() == ["c"] and list(gl.ghosts) == ["a", "b"]


def test_a_deep_copy_keeps_its_ghosts_and_keys_apart() -> None:
    """``can_store``'s test deep-copies a manager; a ghost record made of a sentinel
    ``object()`` became another object in the copy, which then took its ghosts for
    listed keys."""
    gl: GhostedList[str] = GhostedList()
    gl.add_all(["a", "b", "c"])
    assert gl.bury(["a"]) == []
    copy = deepcopy(gl)
    assert "a" in copy.ghosts and "a" not in copy and len(copy) == 2
    assert copy.ordered() == ["b", "c"] and list(copy.ghosts) == ["a"]
    copy.add_all(["d"])
    assert copy.ordered() == ["b", "c", "d"] and len(copy.ghosts) == 1


def test_a_timed_list_stamps_each_add_and_touch_in_call_order() -> None:
    """``TimedGhostedList`` (adaptive's probation): a key's record is its last-use
    time, stamped from the shared clock by each add and touch -- of a parked key too
    -- and kept as given by ``take_in`` (a demotion keeps the block's time)."""
    clock = count()
    gl: TimedGhostedList[str] = TimedGhostedList(clock)
    gl.add_all(["a", "b"])  # 0, 1
    gl.add("c")  # 2
    gl.touch("a")  # 3
    assert gl.coldest(1, {"b"}.__contains__, ()) == ["c"]  # parks b
    assert gl.ordered() == ["b", "c", "a"]
    gl.touch("b")  # 4, from where it is parked
    gl.take_in(["d"], [-7])
    assert gl.ordered() == ["c", "a", "b", "d"]
    assert {k: gl.time(k) for k in gl.ordered()} == {"c": 2, "a": 3, "b": 4, "d": -7}
    assert gl.bury(["c"]) == [] and list(gl.ghosts) == ["c"]
    gl.add("c")  # a returning ghost: 5
    assert gl.time("c") == 5 and not gl.ghosts and next(clock) == 6
