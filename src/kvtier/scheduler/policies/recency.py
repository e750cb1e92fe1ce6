"""``RecencyList``: blocks from least to most recently used, with held blocks parked.

Runs in the scheduler; pure Python. The building block of every policy here.

The order is a queue of entries (``KeyRing``, ``policies/ring.py``) beside a plain
dict of the keys in it: adding a key appends an entry; touching one appends another
and leaves its old entry *dead*; removing one leaves its entry dead. A key's dead
entries are counted in ``_stale`` and come before its live one (its last), so the
queue read from the front, skipping each key's first ``_stale[key]`` entries, is the
order, coldest first::

    _queue:  a  b  c  b  d        (oldest entry first)
    _live:   {a, b, c, d}          key -> value
    _stale:  {b: 1}                b's first entry is dead: the order is a c b d

An ``OrderedDict`` keeps a linked node per key and, to step from one key to the next,
looks the key up again; for lists of 200,000 keys each of those is a cache miss. Here
a block stored and later evicted costs one insert and one delete in ``_live`` and an
entry written and read in order in the queue. Dead entries at the front are dropped
when the front is read; the queue is rebuilt from the live entries when the dead ones
outnumber the live ones (plus ``COMPACT_SLACK``), so it stays within twice the list.

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
the ``n`` oldest entries of the queue are live keys neither held nor protected -- the
usual case -- they are the answer, read by one slice and checked by C-level passes;
``remove_found`` of those keys then takes them off the front of the queue.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import (
    Callable,
    Collection,
    Generator,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from itertools import chain, compress, count, islice, takewhile
from operator import is_not
from typing import Generic, TypeVar

from kvtier.scheduler.policies.base import HeldBlocks
from kvtier.scheduler.policies.ring import KeyRing

K = TypeVar("K", bound=Hashable)

FRESH_BATCHES = 64
"""Batches remembered as added since the last parking (stores in flight, roughly)."""

COMPACT_SLACK = 64
"""Dead entries allowed beyond the list's own size before the queue is rebuilt."""


class RecencyList(Generic[K]):
    """An LRU order over keys where held keys are parked instead of skipped."""

    __slots__ = (
        "_checked",
        "_fresh",
        "_live",
        "_parked",
        "_queue",
        "_released",
        "_seq",
        "_stale",
    )

    def __init__(self) -> None:
        self._live: dict[K, int | None] = {}  # keys in the queue (not parked) -> value
        self._queue: KeyRing[K] = KeyRing()  # entries, oldest first (module docstring)
        self._stale: Counter[K] = Counter()  # key -> its dead entries in the queue
        # The front entries ``coldest`` last returned, all live; forgotten when an
        # entry dies (``_kill``), so ``remove_found`` need not check them again.
        self._checked: list[K] | None = None
        # key -> (parking sequence number, its value); in parking order
        self._parked: dict[K, tuple[int, int | None]] = {}
        self._released: list[tuple[int, K]] = []  # heap of parked keys offered first
        self._seq = 0
        # Batches added (add_all) while keys were parked, and since the last parking:
        # none of their keys can be parked, so releasing one visits nothing. Found by
        # (first key, last key, length); the value is the batch itself.
        self._fresh: dict[tuple[K, K, int], list[K]] = {}

    def __len__(self) -> int:
        return len(self._live) + len(self._parked)

    def __contains__(self, key: object) -> bool:
        return key in self._live or key in self._parked

    def keys(self) -> Iterator[K]:
        """Every key, parked or not, in no particular order."""
        return chain(self._parked, self._live)

    def add(self, key: K) -> None:
        """Add a new key as the most recent. The key must not be in the list."""
        self._live[key] = None
        self._queue.push(key)

    def add_all(self, keys: Sequence[K]) -> None:
        """Add new keys, in order, as the most recent (none may be in the list)."""
        # One C-level pass; ``setdefault`` (of new keys: a plain insert) is called
        # with the key on the stack, where ``update`` of (key, None) pairs builds and
        # unpacks a tuple per key.
        deque(map(self._live.setdefault, keys), maxlen=0)
        self._queue.push_all(keys)
        if self._parked:
            self._note_fresh(keys)

    def _note_fresh(self, keys: Sequence[K]) -> None:
        """Remember a batch just added while some keys are parked (``release_all``)."""
        if keys:
            fresh = self._fresh
            fresh[keys[0], keys[-1], len(keys)] = list(keys)  # a same-named one is lost
            if len(fresh) > FRESH_BATCHES:
                del fresh[next(iter(fresh))]  # the oldest: its release looks its keys up

    def _kill(self, keys: Iterable[K]) -> None:
        """The live entries of ``keys`` are dead now: each key was touched (a new
        entry follows) or removed. Rebuilds the queue when dead entries outnumber the
        live ones by ``COMPACT_SLACK``."""
        self._stale.update(keys)  # C-level counting
        self._checked = None
        queue = self._queue
        if len(queue) > 2 * len(self._live) + COMPACT_SLACK:
            queue.rebuild(list(self._in_order()))
            self._stale.clear()

    def _trim(self) -> None:
        """Drop the dead entries at the front of the queue (its front is live then)."""
        stale = self._stale
        if not stale:
            return
        queue = self._queue
        while queue:
            key = queue.front()
            dead = stale.get(key)
            if not dead:
                return
            queue.pop()
            if dead == 1:
                del stale[key]
            else:
                stale[key] = dead - 1

    def _in_order(self) -> Iterator[K]:
        """The keys in the queue (not parked), coldest first: each key's live entry."""
        stale = self._stale
        if not stale:
            return iter(self._queue)
        return _live_entries(iter(self._queue), stale)

    def touch(self, key: K) -> None:
        """Make a key that is in the list the most recent."""
        if key in self._live:
            self._kill((key,))
        else:
            del self._parked[key]  # a stale heap entry, if any, is dropped lazily
            self._live[key] = None
        self._queue.push(key)

    def touch_all(self, keys: Sequence[K]) -> None:
        """``touch`` each key, in order (each must be in the list)."""
        parked = self._parked
        if parked and not parked.keys().isdisjoint(keys):
            for key in keys:
                self.touch(key)
        else:  # the usual case: C-level passes
            self._queue.push_all(keys)
            self._kill(keys)

    def touch_listed(self, keys: Sequence[K]) -> int:
        """``touch`` keys in turn while they are in the order (not parked), in
        C-level passes; return how many were touched (``len(keys)`` when all were)."""
        done = len(list(takewhile(self._live.__contains__, keys)))
        if done:
            head = keys if done == len(keys) else keys[:done]
            self._queue.push_all(head)
            self._kill(head)
        return done

    def move_all_to_end(self, keys: Sequence[K]) -> None:
        """Make each key the most recent, in order, adding those not in the list."""
        live, parked, stale = self._live, self._parked, self._stale
        for key in keys:
            if key in live:
                stale[key] = stale.get(key, 0) + 1
            else:
                if parked:
                    parked.pop(key, None)
                live[key] = None
        self._queue.push_all(keys)
        self._kill(())

    def discard_all(self, keys: Sequence[K]) -> None:
        """Remove those of ``keys`` that are in the list."""
        live = self._live
        gone = list(dict.fromkeys(filter(live.__contains__, keys)))
        if gone:
            deque(map(live.pop, gone), maxlen=0)
            self._kill(gone)
        parked = self._parked
        if parked:
            for key in parked.keys() & keys:  # C-level: looks each key up in parked
                del parked[key]

    def members(self, keys: Iterable[K]) -> list[K]:
        """Those of ``keys`` in the list, in order (C-level when none is parked)."""
        if self._parked:
            return [key for key in keys if key in self]
        return list(filter(self._live.__contains__, keys))

    def holds_all(self, keys: Sequence[K]) -> bool:
        """Whether every key is in the list (one C-level pass when none is parked)."""
        if self._parked:
            return all(key in self for key in keys)
        return all(map(self._live.__contains__, keys))

    def remove(self, key: K) -> None:
        """Remove a key that is in the list."""
        if key in self._live:
            del self._live[key]
            self._kill((key,))
        else:
            del self._parked[key]

    def remove_all(self, keys: Sequence[K]) -> None:
        """``remove`` each key (each must be in the list, once)."""
        missing = self.remove_found(keys)
        if missing:
            raise KeyError(missing[0])

    def remove_found(self, keys: Sequence[K]) -> list[K]:
        """Remove those of ``keys`` (distinct) that are in the list; return the others.

        The usual case, the keys ``coldest`` chose, is the front of the queue: those
        entries are taken off it (one slice) and the keys deleted in one C-level
        pass. Keys past the matching front are looked up one by one.
        """
        self._trim()
        queue, live, stale = self._queue, self._live, self._stale
        front = queue.peek(len(keys))
        m = next(compress(count(), map(is_not, front, keys)), len(front))
        if m and stale and keys is not self._checked and not stale.keys().isdisjoint(front[:m]):
            m = 0  # a key's front entry may be dead: look each key up
        self._checked = None
        if m:
            deque(map(live.pop, queue.take(m)), maxlen=0)
            if m == len(keys):
                return []
            keys = keys[m:]
        parked = self._parked
        gone, others = [], []
        for key in keys:
            if key in live:
                del live[key]
                gone.append(key)
            elif key in parked:
                del parked[key]
            else:
                others.append(key)
        if gone:
            self._kill(gone)
        return others

    def first_n(self, n: int) -> list[K]:
        """The ``n`` coldest keys, held or not (as ``ordered()[:n]``, without sorting)."""
        return list(islice(chain(self._parked, self._in_order()), n))

    def release(self, key: K) -> None:
        """Tell the list that ``key`` is evictable again (after being held)."""
        entry = self._parked.get(key)
        if entry is not None:
            heapq.heappush(self._released, (entry[0], key))

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

    def coldest(
        self, n: int, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> list[K] | None:
        """The ``n`` coldest evictable keys (as ``evictable`` yields them), or ``None``
        if the list has fewer. Nothing is removed."""
        if not self._released:
            self._trim()
            victims = self._queue.peek(n)
            stale = self._stale
            if (
                len(victims) == n
                and not (stale and not stale.keys().isdisjoint(victims))  # all live
                and not (
                    is_held.any_of(victims)  # two C-level passes, no call per key
                    if type(is_held) is HeldBlocks
                    else any(map(is_held, victims))
                )
                and not (protected and any(map(protected.__contains__, victims)))
            ):
                self._checked = victims
                return victims
        candidates = self.evictable(is_held, protected)
        try:
            victims = list(islice(candidates, n))
        finally:
            candidates.close()
        return victims if len(victims) == n else None

    def ordered(self) -> list[K]:
        """Every key, coldest first: the parked ones by parking order, then the list."""
        return sorted(self._parked, key=self._parked.__getitem__) + list(self._in_order())

    def transfer(self, keys: Sequence[K], to: RecencyList[K]) -> None:
        """Move ``keys`` (distinct, each in this list, none in ``to``) to the hot end
        of ``to``, in order, each with its value (a demotion keeps the block's time)."""
        live, parked = self._live, self._parked
        if parked and not parked.keys().isdisjoint(keys):
            values = [live[key] if key in live else parked[key][1] for key in keys]
        else:  # the usual case: one C-level pass
            values = list(map(live.__getitem__, keys))
        self.remove_all(keys)
        to._live.update(zip(keys, values, strict=True))
        to._queue.push_all(keys)

    def first(self) -> K:
        """The coldest key, held or not: the first key parked (parked keys are colder
        than the list, and ``_parked`` holds them in parking order), else the list's."""
        if self._parked:
            return next(iter(self._parked))
        self._trim()  # the front entry is live then
        if not self._queue:
            raise KeyError("first of an empty list")
        return self._queue.front()

    def evictable(
        self, is_held: Callable[[K], bool], protected: Collection[K]
    ) -> Generator[K, None, None]:
        """Yield evictable keys, coldest first, without removing them.

        First parks the run of held keys at the cold end. Keys in ``protected`` and
        held keys further in are skipped and stay where they are (a held key skipped
        now is parked by a later call, once the keys before it are gone). The caller
        removes the keys it evicts, after closing the generator.
        """
        queue, live = self._queue, self._live
        while True:
            self._trim()
            if not queue or not is_held(key := queue.front()):
                break
            queue.pop()
            self._parked[key] = (self._seq, live.pop(key))
            self._seq += 1
            self._fresh.clear()  # a batch added before may hold this key
        yield from self._released_evictable(is_held, protected)
        for key in self._in_order():
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


def _live_entries(entries: Iterator[K], stale: Mapping[K, int]) -> Iterator[K]:
    """The live ones of ``entries`` (oldest first): each key's first ``stale[key]``
    entries are dead (``stale`` is read, not changed)."""
    dead = stale.get
    passed: dict[K, int] = {}  # key -> its dead entries passed
    for key in entries:
        n = dead(key)
        if n:
            seen = passed.get(key, 0)
            if seen < n:
                passed[key] = seen + 1
                continue
        yield key
