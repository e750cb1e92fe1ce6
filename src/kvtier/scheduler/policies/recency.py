"""``RecencyList``: blocks from least to most recently used, with held blocks parked.

Runs in the scheduler; pure Python. The building block of every policy here.

The manager never shows pins to a policy; it only answers "is this block held?"
(STORING, or pinned by a load) while the policy looks for victims. Held blocks at the
cold end of the list are *parked*: taken out of the list, so that no later search walks
past them again. A held block further in is skipped once and parked by a later search,
when the blocks before it have been evicted. That is what makes eviction cost
proportional to the blocks evicted, not to the blocks pinned.

Parking keeps the order exact. Only the coldest block of the list is ever parked, so a
parked block is colder than every block the list holds afterwards (those were warmer
then, or were touched or added since). Parked blocks that become evictable again wait
in a heap keyed by their parking sequence and are offered before the list::

    coldest ─► [released parked blocks, by parking order] ─► [the list, LRU → MRU] ─► hottest

A touch of a parked block simply moves it back to the hot end of the list.

Releasing a batch that ``add_all`` added while keys were parked (a store completing)
is free: the batch is noted, the note forgotten at the next parking, and none of its
keys can be parked meanwhile, so its release looks none up among the parked keys. A
note is a copy of the batch found by its first and last key and its length; the
release compares the lists (pointer by pointer), without hashing every key.

Each key carries a value, kept while the key is parked and moved with it by
``transfer``: ``None`` here; ``TimedRecencyList`` (``policies/timed.py``) keeps the
key's last-use time there, for the adaptive policy's comparisons between two lists.

``coldest(n)`` is the fast path of a search: when nothing is waiting in the heap and
the ``n`` coldest keys of the list are neither held nor protected -- the usual case --
they are the answer, taken by ``islice`` and checked by one set test per held kind
(``base.any_held``), without the generator.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import (
    Callable,
    Collection,
    Generator,
    Hashable,
    Iterable,
    Iterator,
    Sequence,
)
from itertools import chain, filterfalse, islice
from typing import TYPE_CHECKING, Generic, TypeVar

from kvtier.scheduler.policies.base import any_held

if TYPE_CHECKING:
    from kvtier.scheduler.policies.ghosted import GhostedList

K = TypeVar("K", bound=Hashable)

FRESH_BATCHES = 64
"""Batches remembered as added since the last parking (stores in flight, roughly)."""

STALE_FACTOR = 2
STALE_SLACK = 64
"""The released heap is compacted when it holds more than ``STALE_FACTOR`` entries per
parked key plus ``STALE_SLACK`` (``_bound_released``)."""


class RecencyList(Generic[K]):
    """An LRU order over keys where held keys are parked instead of skipped."""

    __slots__ = ("_fresh", "_order", "_parked", "_released", "_seq")

    def __init__(self) -> None:
        self._order: OrderedDict[K, int | None] = OrderedDict()  # key -> its value
        # key -> (parking sequence number, its value); in parking order
        self._parked: dict[K, tuple[int, int | None]] = {}
        self._released: list[tuple[int, K]] = []  # heap of parked keys offered first
        self._seq = 0
        # Batches added (add_all) while keys were parked, and since the last parking:
        # none of their keys can be parked, so releasing one visits nothing. Found by
        # (first key, last key, length); the value is the batch itself.
        self._fresh: dict[tuple[K, K, int], list[K]] = {}

    def __len__(self) -> int:
        return len(self._order) + len(self._parked)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._parked

    def keys(self) -> Iterator[K]:
        """Every key, parked or not, in no particular order."""
        return chain(self._parked, self._order)

    def add(self, key: K) -> None:
        """Add a new key as the most recent. The key must not be in the list."""
        self._order[key] = None

    def add_all(self, keys: Sequence[K]) -> None:
        """Add new keys, in order, as the most recent (none may be in the list)."""
        order = self._order
        for key in keys:
            order[key] = None
        if self._parked:
            self._note_fresh(keys)

    def _note_fresh(self, keys: Sequence[K]) -> None:
        """Remember a batch just added while some keys are parked (``release_all``)."""
        if keys:
            fresh = self._fresh
            fresh[keys[0], keys[-1], len(keys)] = list(keys)  # a same-named one is lost
            if len(fresh) > FRESH_BATCHES:
                del fresh[next(iter(fresh))]  # the oldest: its release looks its keys up

    def touch(self, key: K) -> None:
        """Make a key that is in the list the most recent."""
        if key in self._order:
            self._order.move_to_end(key)
        else:
            del self._parked[key]  # a stale heap entry, if any, is dropped lazily
            self._order[key] = None

    def touch_all(self, keys: Sequence[K]) -> None:
        """``touch`` each key, in order (each must be in the list): moved to the end
        while the keys are in the order (the usual case: all of them), then key by key
        from the first parked one. The parked keys -- every pinned block that reached
        the cold end -- are not looked up first."""
        done = self.touch_listed(keys)
        for key in keys[done:]:
            self.touch(key)

    def touch_listed(self, keys: Sequence[K]) -> int:
        """``touch`` keys in turn while they are in the order (not parked); return how
        many were touched (``len(keys)`` when all were)."""
        move_to_end = self._order.move_to_end
        try:
            for key in keys:
                move_to_end(key)
        except KeyError:  # this key is parked or not in the list: it and the rest not touched
            # Its first place: had it been touched earlier it would be in the order now.
            return keys.index(key)
        return len(keys)

    def move_all_to_end(self, keys: Sequence[K]) -> None:
        """Make each key the most recent, in order, adding those not in the list."""
        order, parked = self._order, self._parked
        for key in keys:
            if key in order:
                order.move_to_end(key)
            else:
                parked.pop(key, None)
                order[key] = None

    def members(self, keys: Iterable[K]) -> list[K]:
        """Those of ``keys`` in the list, in order (C-level when none is parked)."""
        if self._parked:
            return [key for key in keys if key in self]
        return list(filter(self._order.__contains__, keys))

    def holds_all(self, keys: Sequence[K]) -> bool:
        """Whether every key is in the list (one C-level pass when none is parked)."""
        if self._parked:
            return all(key in self for key in keys)
        return all(map(self._order.__contains__, keys))

    def remove(self, key: K) -> None:
        """Remove a key that is in the list."""
        if key in self._order:
            del self._order[key]
        else:
            del self._parked[key]

    def remove_all(self, keys: Sequence[K]) -> None:
        """``remove`` each key (each must be in the list, once)."""
        missing = self.remove_found(keys)
        if missing:
            raise KeyError(missing[0])

    def remove_found(self, keys: Sequence[K]) -> list[K]:
        """Remove those of ``keys`` (distinct) that are in the list; return the others.

        The usual case, every key in the order, is one pass and no other lookup; from
        the first key not there, the rest are looked up among the parked ones too.
        """
        order = self._order
        try:
            for key in keys:
                del order[key]
        except KeyError:  # this key is not in the order: it and the rest are left
            done = keys.index(key)  # the keys are distinct
        else:
            return []
        rest = keys[done:]
        parked = self._parked
        if parked and not parked.keys().isdisjoint(rest):
            rest = [key for key in rest if parked.pop(key, None) is None]
        here = list(filter(order.__contains__, rest))  # usually none: another list's
        if not here:
            return list(rest)
        others = list(filterfalse(order.__contains__, rest))
        for key in here:
            del order[key]
        return others

    def first_n(self, n: int) -> list[K]:
        """The ``n`` coldest keys, held or not (as ``ordered()[:n]``, without sorting)."""
        return list(islice(chain(self._parked, self._order), n))

    def release(self, key: K) -> None:
        """Tell the list that ``key`` is evictable again (after being held)."""
        entry = self._parked.get(key)
        if entry is not None:
            heapq.heappush(self._released, (entry[0], key))
            self._bound_released()

    def release_all(self, keys: Sequence[K]) -> None:
        """``release`` each key; nothing to do unless some key was parked.

        Only the parked keys among ``keys`` are visited (a C-level intersection), so
        releasing costs nothing per pinned block elsewhere in the list; and a batch
        noted by ``add_all`` since the last parking (a store completing: the usual
        release) visits nothing at all, as none of its keys can be parked. The order
        of the pushes does not matter: the heap orders them by parking sequence.
        """
        parked = self._parked
        if not (parked and keys):
            return
        noted = self._fresh.pop((keys[0], keys[-1], len(keys)), None)
        if noted is None or noted != (keys if type(keys) is list else list(keys)):
            for key in parked.keys() & keys:
                heapq.heappush(self._released, (parked[key][0], key))
            self._bound_released()

    def _bound_released(self) -> None:
        """Once the heap outgrows ``STALE_FACTOR`` entries per parked key, drop its stale
        entries (of keys touched, removed or parked again since their release) and its
        duplicates. A search drops those it pops, but only up to the first key it
        offers: a list whose coldest released key is never chosen (a ``density`` class
        ranked above the others) would keep one per release of a block touched after
        it. Amortised O(1) per release, and the heap stays O(parked)."""
        parked = self._parked
        if len(self._released) <= STALE_FACTOR * len(parked) + STALE_SLACK:
            return
        live = {
            key: seq
            for seq, key in self._released
            if (entry := parked.get(key)) is not None and entry[0] == seq
        }
        self._released = [(seq, key) for key, seq in live.items()]
        heapq.heapify(self._released)

    def coldest(
        self, n: int, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> list[K] | None:
        """The ``n`` coldest evictable keys (as ``evictable`` yields them), or ``None``
        if the list has fewer. Nothing is removed."""
        if not self._released:
            victims = list(islice(self._order, n))
            if (
                len(victims) == n
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

    def ordered(self) -> list[K]:
        """Every key, coldest first: the parked ones by parking order, then the list."""
        return sorted(self._parked, key=self._parked.__getitem__) + list(self._order)

    def transfer(self, keys: Sequence[K], to: RecencyList[K] | GhostedList[K]) -> None:
        """Move ``keys`` (distinct, each in this list, none in ``to``) to the hot end
        of ``to``, in order, each with its value (a demotion keeps the block's time)."""
        order, parked = self._order, self._parked
        if parked and not parked.keys().isdisjoint(keys):
            values = [order.pop(key) if key in order else parked.pop(key)[1] for key in keys]
        else:  # the usual case: one C-level pass
            values = list(map(order.pop, keys))
        to.take_in(keys, values)

    def take_in(self, keys: Sequence[K], values: Sequence[int | None]) -> None:
        """Add keys not in the list, each with its value, in order, as the most
        recent (``transfer`` to this list)."""
        self._order.update(zip(keys, values, strict=True))

    def first(self) -> K:
        """The coldest key, held or not: the first key parked (parked keys are colder
        than the list, and ``_parked`` holds them in parking order), else the list's."""
        if self._parked:
            return next(iter(self._parked))
        return next(iter(self._order))

    def evictable(
        self, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> Generator[K, None, None]:
        """Yield evictable keys, coldest first, without removing them.

        First parks the run of held keys at the cold end. Keys in ``protected`` and
        held keys further in are skipped and stay where they are (a held key skipped
        now is parked by a later call, once the keys before it are gone). The caller
        removes the keys it evicts, after closing the generator.
        """
        order = self._order
        while order:
            key = next(iter(order))
            if not is_held(key):
                break
            self._parked[key] = (self._seq, order.pop(key))
            self._seq += 1
            self._fresh.clear()  # a batch added before may hold this key
        yield from self._released_evictable(is_held, protected)
        for key in order:
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
                entry = self._parked.get(key)
                if entry is None or entry[0] != seq or is_held(key) or key in seen:
                    continue  # touched, removed, held again, or released twice
                seen.add(key)
                keep.append((seq, key))
                if key not in protected:
                    yield key
        finally:
            for seq, key in keep:
                entry = self._parked.get(key)
                if entry is not None and entry[0] == seq:
                    heapq.heappush(heap, (seq, key))
