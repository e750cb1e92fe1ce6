"""``GhostedList``: a recency list and the ghosts of its evicted keys, in one table.

Runs in the scheduler; pure Python. ARC's T1 (blocks used once) and B1 (keys evicted
from T1) are two lists of one key space: a key is in at most one of them, a victim
goes from T1 to B1, an incoming key is tested against B1 before it enters T1. Kept
as a recency list and a ghost list, every stored and evicted block went through two
large tables (T1's ``OrderedDict`` and B1's set, whose churn also rebuilt it). Here one
dict holds a record per key, and two queues of entries hold the orders::

    _rec:    key -> its value (in the list: queued or parked) | GHOST
    _order:  the list's keys, coldest first   (EntryQueue: a touched, removed or
    _ghosts: the ghosts, oldest first          skipped-and-evicted key leaves a dead entry)
    _parked: held keys taken off the order's front, in parking order (as RecencyList)

so an incoming key's ghost test and its insert probe the same slot, a victim becomes
a ghost by rewriting its record in place, and a dropped ghost is one delete. Held
keys at the cold end are parked and released parked keys wait in a heap, offered
before the order, exactly as in ``RecencyList`` (``policies/recency.py``), so the
eviction order is the same: parked (by parking order), then the list, coldest first.

The list is used like ``RecencyList`` (the methods ARC asks of T1 and segmented LRU
of probation); ``ghosts`` is a view with ``GhostList``'s methods. A key's dead entries
in a queue are its first ones, so the front's dead entries are dropped by count
(``EntryQueue``). Each key of the list carries a value, as in ``RecencyList``:
``True`` here, its last-use time in ``TimedGhostedList`` (``policies/timed.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Generator, Hashable, Iterable, Iterator, Sequence
from itertools import islice, repeat
from typing import Final, Generic, TypeVar

from kvtier.scheduler.policies.base import any_held
from kvtier.scheduler.policies.entries import EntryQueue
from kvtier.scheduler.policies.recency import FRESH_BATCHES

K = TypeVar("K", bound=Hashable)

GHOST: Final = False
"""The record of a ghost; a key of the list has its value (``True``, or a time: an
int, never ``False`` itself, as records are told apart by identity). A builtin, not
a sentinel ``object()``: a deep copy of the list keeps it as it is."""


class GhostedList(Generic[K]):
    """An LRU order over keys, held keys parked, with a FIFO of the keys it evicted."""

    __slots__ = (
        "_fresh",
        "_ghosts",
        "_listed",
        "_order",
        "_parked",
        "_rec",
        "_released",
        "_seq",
        "ghosts",
    )

    def __init__(self) -> None:
        self._rec: dict[K, object] = {}
        self._order: EntryQueue[K] = EntryQueue()
        self._ghosts: EntryQueue[K] = EntryQueue()
        self._listed = 0  # keys in the list (queued or parked)
        self._parked: dict[K, int] = {}  # key -> its parking sequence, in parking order
        self._released: list[tuple[int, K]] = []  # heap of parked keys offered first
        self._seq = 0
        # Batches added while keys were parked, and since the last parking (as in
        # RecencyList): releasing one visits nothing.
        self._fresh: dict[tuple[K, K, int], list[K]] = {}
        self.ghosts = Ghosts(self)

    # -- the list ----------------------------------------------------------------

    def __len__(self) -> int:
        return self._listed

    def __contains__(self, key: object) -> bool:
        return self._rec.get(key, GHOST) is not GHOST  # type: ignore[arg-type]

    def keys(self) -> Iterator[K]:
        """Every key of the list, parked or not, in no particular order."""
        return (key for key, value in self._rec.items() if value is not GHOST)

    def ordered(self) -> list[K]:
        """Every key of the list, coldest first: the parked ones, then the order."""
        return [*self._parked, *self._order]

    def _stamps(self) -> Iterator[object]:
        """The values of keys added or touched, in call order (a subclass stamps)."""
        return repeat(True)

    def add(self, key: K) -> None:
        """Add a key not in the list as the most recent (a ghost leaves the ghosts)."""
        if self._rec.get(key) is GHOST:
            self._ghosts.kill(key)
            del self._rec[key]
        self.add_all([key])

    def add_all(self, keys: Sequence[K]) -> None:
        """Add keys that are neither in the list nor ghosts, in order, as the most
        recent."""
        rec = self._rec
        before = len(rec)
        rec.update(zip(keys, self._stamps(), strict=False))  # a key, then its stamp
        assert len(rec) - before == len(keys), "add_all: a key is listed or a ghost"
        self._order.push(keys)
        self._listed += len(keys)
        if self._parked:
            self._note_fresh(keys)

    def take_in(self, keys: Sequence[K], values: Sequence[object]) -> None:
        """Add keys that are neither in the list nor ghosts, each with its value, in
        order, as the most recent (``RecencyList.transfer`` to this list)."""
        rec = self._rec
        before = len(rec)
        rec.update(zip(keys, values, strict=True))
        assert len(rec) - before == len(keys), "take_in: a key is listed or a ghost"
        self._order.push(keys)
        self._listed += len(keys)

    def _note_fresh(self, keys: Sequence[K]) -> None:
        """Remember a batch just added while some keys are parked (``release_all``)."""
        if keys:
            fresh = self._fresh
            fresh[keys[0], keys[-1], len(keys)] = list(keys)
            if len(fresh) > FRESH_BATCHES:
                del fresh[next(iter(fresh))]

    def touch(self, key: K) -> None:
        """Make a key of the list the most recent."""
        if self._parked.pop(key, None) is None:
            self._order.kill(key)  # a stale heap entry, if parked, is dropped lazily
        self._order.push([key])

    def members(self, keys: Iterable[K]) -> list[K]:
        """Those of ``keys`` in the list, in order."""
        return list(filter(self.__contains__, keys))

    def remove_all(self, keys: Sequence[K]) -> None:
        """``remove`` each key (each must be in the list, once)."""
        missing = self.remove_found(keys)
        if missing:
            raise KeyError(missing[0])

    def remove(self, key: K) -> None:
        """Remove a key of the list (it becomes nothing, not a ghost)."""
        if self._parked.pop(key, None) is None:
            self._order.kill(key)
        del self._rec[key]
        self._listed -= 1

    def discard_all(self, keys: Iterable[K]) -> None:
        """Remove those of ``keys`` that are in the list."""
        for key in keys:
            if key in self:
                self.remove(key)

    def remove_found(self, keys: Sequence[K]) -> list[K]:
        """Remove those of ``keys`` (distinct) that are in the list; return the others."""
        others = []
        for key in keys:
            if key in self:
                self.remove(key)
            else:
                others.append(key)
        return others

    def bury(self, victims: Sequence[K], *, all_ghosts: bool = False) -> list[K]:
        """Evict those of ``victims`` (distinct, none a ghost) in the list: each
        becomes the newest ghost, in order. Return the others, in order; with
        ``all_ghosts`` they become ghosts too, in their places among the victims (a
        segmented LRU's victims from its other list share these ghosts).

        The usual case -- the victims are the order's coldest entries, as ``coldest``
        took them -- dequeues them and rewrites their records in place.
        """
        rec = self._rec
        if self._order.front(len(victims)) == victims:
            self._order.take(len(victims))
            rec.update(zip(victims, repeat(GHOST)))
            self._ghosts.push(victims)
            self._listed -= len(victims)
            return []
        buried, others = [], []
        parked, order = self._parked, self._order
        for key in victims:
            if rec.get(key, GHOST) is not GHOST:
                if parked.pop(key, None) is None:
                    order.kill(key)
                self._listed -= 1
            else:
                others.append(key)
                if not all_ghosts:
                    continue
            rec[key] = GHOST
            buried.append(key)
        self._ghosts.push(buried)
        return others

    # -- held keys, as in RecencyList ------------------------------------------------

    def release(self, key: K) -> None:
        """Tell the list that ``key`` is evictable again (after being held)."""
        seq = self._parked.get(key)
        if seq is not None:
            heapq.heappush(self._released, (seq, key))

    def release_all(self, keys: Sequence[K]) -> None:
        """``release`` each key: only parked ones are visited, none for a batch noted
        by ``add_all`` since the last parking (``RecencyList.release_all``)."""
        parked = self._parked
        if not (parked and keys):
            return
        noted = self._fresh.pop((keys[0], keys[-1], len(keys)), None)
        if noted is None or noted != (keys if type(keys) is list else list(keys)):
            for key in parked.keys() & keys:
                heapq.heappush(self._released, (parked[key], key))

    def coldest(
        self, n: int, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> list[K] | None:
        """The ``n`` coldest evictable keys (as ``evictable`` yields them), or ``None``
        if the list has fewer. Nothing is removed."""
        if not self._released:
            victims = self._order.front(n)
            if (
                victims is not None
                and not any_held(is_held, victims)
                and not (protected and any(map(protected.__contains__, victims)))
            ):
                return victims
        candidates = self.evictable(is_held, protected)
        try:
            victims = list(islice(candidates, n))
        finally:
            candidates.close()
        return victims if len(victims) == n else None

    def evictable(
        self, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> Generator[K, None, None]:
        """Yield evictable keys, coldest first, without removing them: parks the run
        of held keys at the cold end first (``RecencyList.evictable``)."""
        order = self._order
        while True:
            order.drop_dead_front()
            if not len(order):
                break
            key = order.first()
            if not is_held(key):
                break
            order.take(1)
            self._parked[key] = self._seq
            self._seq += 1
            self._fresh.clear()  # a batch added before may hold this key
        yield from self._released_evictable(is_held, protected)
        for key in order.live(order.entries()):
            if key not in protected and not is_held(key):
                yield key

    def _released_evictable(
        self, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> Iterator[K]:
        """Yield released parked keys in parking order; drop stale heap entries."""
        if not self._released:
            return
        keep: list[tuple[int, K]] = []
        seen: set[K] = set()
        heap = self._released
        try:
            while heap:
                seq, key = heapq.heappop(heap)
                if self._parked.get(key) != seq or is_held(key) or key in seen:
                    continue  # touched, removed, held again, or released twice
                seen.add(key)
                keep.append((seq, key))
                if key not in protected:
                    yield key
        finally:
            for seq, key in keep:
                if self._parked.get(key) == seq:
                    heapq.heappush(heap, (seq, key))


class Ghosts(Generic[K]):
    """The ghosts of a ``GhostedList``, with ``GhostList``'s methods."""

    __slots__ = ("_of",)

    def __init__(self, of: GhostedList[K]) -> None:
        self._of = of

    def __len__(self) -> int:
        of = self._of
        return len(of._rec) - of._listed

    def __contains__(self, key: object) -> bool:
        return self._of._rec.get(key) is GHOST  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        """The ghosts, oldest first."""
        return iter(self._of._ghosts)

    def isdisjoint(self, keys: Iterable[K]) -> bool:
        """Whether none of ``keys`` is a ghost: one C-level pass over the shared table
        (a key found there is a ghost or in the list; only then each is asked)."""
        rec = self._of._rec
        if len(rec) == self._of._listed:
            return True
        if isinstance(keys, (list, tuple)) and rec.keys().isdisjoint(keys):
            return True
        return not any(rec.get(key) is GHOST for key in keys)

    def update(self, keys: Iterable[K]) -> None:
        """Add keys that are neither ghosts nor in the list, in order, as the newest."""
        batch = list(keys)
        rec = self._of._rec
        before = len(rec)
        rec.update(dict.fromkeys(batch, GHOST))
        if len(rec) - before != len(batch):
            raise ValueError("update: a key is already a ghost or in the list")
        self._of._ghosts.push(batch)

    def remove(self, key: K) -> None:
        """Take out a ghost (its block is stored again)."""
        if self._of._rec.get(key) is not GHOST:
            raise KeyError(key)
        del self._of._rec[key]
        self._of._ghosts.kill(key)

    def discard(self, key: K) -> None:
        """``remove`` the key if it is a ghost."""
        if key in self:
            self.remove(key)

    def pop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest ghosts (none when ``n <= 0``; at most ``len(self)``)."""
        if n > 0:
            rec = self._of._rec
            for key in self._of._ghosts.take_live(n):
                del rec[key]
