"""``EntryQueue``: a FIFO of key entries, some of them dead, counted per key.

Runs in the scheduler; pure Python. The order of a ghost list (keys evicted, oldest
first) and of a list that keeps its keys in a table shared with its ghosts
(``policies/ghosted.py``) is a queue of entries: a key joins at the newest end, and
when it leaves from elsewhere than the front (a ghost that returns, a block touched
or promoted) its entry stays queued, *dead*, counted in ``_dead``. A key's entries
are queued oldest first and only its newest can be live, so its dead entries are its
first ones: reading from the front skips them by the count, and the queue is rebuilt
from its live entries when dead ones outnumber them (plus ``COMPACT_SLACK``).

The queue is a ring: one list, the index of its oldest entry and the count queued::

    _ring:  [k4, - | k2, k3, k2'] (wraps)   _head = 2, _size = 4: k2, k3, k2', k4
    _dead:  {k2: 1}                         (k2's first entry is dead)

Pushing a batch is one or two slice assignments; taking the ``n`` oldest is one or
two slices and as many assignments of None (the keys are let go at once, while in
cache): C-level passes, no call per key. The ring grows by half when full, moving only
pointers (copying into a new list would count a reference to every queued key: a
cache miss each). No object is kept per batch (a list per eviction, kept until
dropped, made the cyclic collector run and traverse the tier's large tables).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Generic, TypeVar, cast

K = TypeVar("K", bound=Hashable)

COMPACT_SLACK = 64
"""Dead entries allowed beyond the live ones before the queue is rebuilt."""

MIN_RING = 64
"""Slots of an empty ring."""


class EntryQueue(Generic[K]):
    """A FIFO of entries with per-key dead counts; ``len`` is the live entries."""

    __slots__ = ("_dead", "_head", "_n_dead", "_ring", "_size")

    def __init__(self) -> None:
        self._ring: list[K | None] = [None] * MIN_RING  # None: a free slot
        self._head = 0  # the slot of the oldest entry
        self._size = 0  # entries queued, live and dead, from _head on (wrapping)
        self._dead: dict[K, int] = {}  # key -> its dead entries queued
        self._n_dead = 0

    def __len__(self) -> int:
        return self._size - self._n_dead

    @property
    def has_dead(self) -> bool:
        """Whether some queued entry is dead."""
        return bool(self._n_dead)

    def entries(self) -> Iterator[K]:
        """Every queued entry, live or dead, oldest first."""
        ring, head = self._ring, self._head
        end = head + self._size
        wrapped = islice(ring, 0, max(0, end - len(ring)))
        return cast(Iterator[K], chain(islice(ring, head, end), wrapped))

    def __iter__(self) -> Iterator[K]:
        """The live entries, oldest first."""
        return self.live(self.entries())

    def live(self, entries: Iterable[K]) -> Iterator[K]:
        """The live ones of ``entries`` (the queue's own, read from the front)."""
        dead = self._dead
        if not dead:
            yield from entries
            return
        skipped: dict[K, int] = {}
        for key in entries:
            n = dead.get(key, 0)
            if n:
                s = skipped.get(key, 0)
                if s < n:
                    skipped[key] = s + 1
                    continue
            yield key

    def push(self, batch: Sequence[K]) -> None:
        """Queue ``batch`` (a list or tuple), in order, at the newest end."""
        n = len(batch)
        size = self._size
        if size + n > len(self._ring):
            self._grow(size + n)
        ring = self._ring
        cap = len(ring)
        tail = (self._head + size) % cap
        if tail + n <= cap:
            ring[tail : tail + n] = batch
        else:  # wraps
            ring[tail:] = batch[: cap - tail]
            ring[: tail + n - cap] = batch[cap - tail :]
        self._size = size + n

    def kill(self, key: K) -> None:
        """The live entry of ``key`` (it must have one) is dead from now on."""
        dead = self._dead
        dead[key] = dead.get(key, 0) + 1
        self._n_dead += 1
        if self._n_dead > self._size - self._n_dead + COMPACT_SLACK:
            self._rebuild(list(self))

    def front(self, n: int) -> list[K] | None:
        """The ``n`` oldest entries when they are all live (dead entries at the front
        are dropped first), else ``None`` (fewer queued, or a key with dead entries
        among them: the caller reads with ``live``). Nothing live changes."""
        self.drop_dead_front()
        if self._size < n:
            return None
        ring, head = self._ring, self._head
        cap = len(ring)
        end = head + n
        out = ring[head:end] if end <= cap else ring[head:] + ring[: end - cap]
        if self._n_dead and not self._dead.keys().isdisjoint(out):
            return None
        return cast(list[K], out)

    def first(self) -> K:
        """The oldest entry, live or dead (the queue must not be empty)."""
        return cast(K, self._ring[self._head])

    def drop_dead_front(self) -> None:
        """Dequeue the dead entries at the front, if any."""
        dead = self._dead
        while dead and self._size:
            key = self.first()
            n = dead.get(key)
            if not n:
                return
            if n == 1:
                del dead[key]
            else:
                dead[key] = n - 1
            self._n_dead -= 1
            self.take(1)

    def take(self, n: int) -> list[K]:
        """Dequeue and return the ``n`` oldest entries (``n`` at most those queued),
        freeing their slots; the caller knows they are live (``front``)."""
        ring, head = self._ring, self._head
        cap = len(ring)
        end = head + n
        if end <= cap:
            taken = ring[head:end]
            ring[head:end] = [None] * n
        else:  # wraps
            taken = ring[head:] + ring[: end - cap]
            ring[head:] = [None] * (cap - head)
            ring[: end - cap] = [None] * (end - cap)
        self._head = end % cap
        self._size -= n
        return cast(list[K], taken)

    def take_live(self, n: int) -> list[K]:
        """Dequeue entries up to the ``n``-th live one (at most ``len(self)``) and
        return the live ones; the dead ones taken are forgotten."""
        out: list[K] = []
        dead = self._dead
        while len(out) < n:
            taken = self.take(n - len(out))
            if not self._n_dead or dead.keys().isdisjoint(taken):  # the usual case
                out += taken
                continue
            for key in taken:  # some are dead (a key's first entries)
                d = dead.get(key)
                if d:
                    if d == 1:
                        del dead[key]
                    else:
                        dead[key] = d - 1
                    self._n_dead -= 1
                else:
                    out.append(key)
        return out

    def _grow(self, need: int) -> None:
        """Make room for ``need`` entries or more (by half): free slots go in just
        after the newest entry, so the entries keep their order. Only pointers move."""
        ring, head = self._ring, self._head
        extra = max(need + need // 2, MIN_RING) - len(ring)
        if head + self._size <= len(ring):  # not wrapped: room at the end
            ring.extend([None] * extra)
        else:  # wrapped: room between the newest entries (at the start) and the oldest
            ring[head:head] = [None] * extra
            self._head = head + extra

    def _rebuild(self, entries: list[K]) -> None:
        """Queue the live ``entries`` alone, from slot 0, in a ring of the same size."""
        ring = self._ring
        self._ring = [*entries, *([None] * (len(ring) - len(entries)))]
        self._head = 0
        self._size = len(entries)
        self._dead.clear()
        self._n_dead = 0
