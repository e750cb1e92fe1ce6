"""``TimedRecencyList``: a ``RecencyList`` whose keys carry their last-use time.

Runs in the scheduler; pure Python. The adaptive policy compares the coldest blocks
of two lists by last use (``policies/adaptive.py``), so it needs every resident
block's last-use time. Kept as the value of the key in the list's own ``OrderedDict``,
a time costs nothing more to store or drop than the key (a separate map cost a
hash-table insert and delete per stored block, and one more write per touch)::

    clock (shared by the lists of a policy): 0, 1, 2, ...
    add / touch of a key ─► the key's value = the clock's next value, in call order

A key moved to another list by ``transfer`` (a demotion) keeps its time; a parked key
keeps it while parked. ``TimedGhostedList`` does the same for a ``GhostedList`` (the
probation list that shares its table with the ghosts), the time as the key's record.
Every method stamps each key it adds or touches once, in the order of its keys, so a
batch method leaves the same times as its per-key loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

from kvtier.scheduler.policies.ghosted import GhostedList
from kvtier.scheduler.policies.recency import K, RecencyList


class TimedRecencyList(RecencyList[K]):
    """A recency list that stamps each add and touch with the next value of ``clock``.

    Args:
        clock: the time source, shared by the lists whose times are compared.
    """

    __slots__ = ("_clock",)

    def __init__(self, clock: Iterator[int]) -> None:
        super().__init__()
        self._clock = clock

    def time(self, key: K) -> int:
        """The key's last-use time (it must be in the list, parked or not)."""
        time = self._order.get(key)
        if time is None:
            time = self._parked[key][1]
        assert time is not None, "every key of a timed list has a time"
        return time

    def add(self, key: K) -> None:
        self._order[key] = next(self._clock)

    def add_all(self, keys: Sequence[K]) -> None:
        order, clock = self._order, self._clock
        for key in keys:
            order[key] = next(clock)
        if self._parked:
            self._note_fresh(keys)

    def touch(self, key: K) -> None:
        order = self._order
        if key in order:
            order.move_to_end(key)
        else:
            del self._parked[key]
        order[key] = next(self._clock)

    def touch_all(self, keys: Sequence[K]) -> None:
        parked = self._parked
        if parked and not parked.keys().isdisjoint(keys):
            for key in keys:
                self.touch(key)
        else:  # the usual case: every key in the order
            order, clock = self._order, self._clock
            for key in keys:
                order.move_to_end(key)
                order[key] = next(clock)  # a repeated key keeps its last time

    def touch_listed(self, keys: Sequence[K]) -> int:
        done = super().touch_listed(keys)
        order, clock = self._order, self._clock
        for key in islice(keys, done):
            order[key] = next(clock)
        return done

    def move_all_to_end(self, keys: Sequence[K]) -> None:
        super().move_all_to_end(keys)  # every key is in the order now
        order, clock = self._order, self._clock
        for key in keys:
            order[key] = next(clock)


class TimedGhostedList(GhostedList[K]):
    """A ``GhostedList`` whose keys carry their last-use time, stamped from ``clock``
    (the adaptive policy's probation list, sharing its table with the ghosts): a
    key's time is its record, written by the same insert as the key.

    Args:
        clock: the time source, shared by the lists whose times are compared.
    """

    __slots__ = ("_clock",)

    def __init__(self, clock: Iterator[int]) -> None:
        super().__init__()
        self._clock = clock

    def _stamps(self) -> Iterator[object]:
        return self._clock

    def time(self, key: K) -> int:
        """The key's last-use time (it must be in the list, parked or not)."""
        time = self._rec[key]
        assert isinstance(time, int), "every key of a timed list has a time"
        return time

    def touch(self, key: K) -> None:
        super().touch(key)
        self._rec[key] = next(self._clock)
