"""``KeyRing``: a FIFO queue of keys in one list, added to and taken from in batches.

Runs in the scheduler; pure Python. The queue under ``RecencyList`` (blocks, coldest
first) and ``GhostList`` (evicted keys, oldest first): both hold one entry per key
(plus dead entries, which their owners count and skip) and take from the front in
batches. An entry is one pointer in a list, where an ``OrderedDict`` keeps a linked
node per key and looks each key up again to step past it; for a queue of 200,000 keys
those nodes and look-ups are cache misses. The ring is one list, the slot of its
oldest entry and the count queued::

    _ring:  [k4, k5, - , - , k1, k2, k3]   _head = 4, _size = 5: k1, k2, k3, k4, k5
             (wraps)   (free: None)

Adding a batch is one or two slice assignments; taking the ``n`` oldest one or two
slices and as many assignments of None (the keys are let go at once): C-level passes,
no call per key. When full the ring grows by half in place, moving only pointers
(copying the entries into a new list would touch, count a reference to, every queued
key: a cache miss each). No object is kept per batch (a list per batch, kept until
taken, made the cyclic garbage collector run over the tier's large tables).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Generic, TypeVar, cast

K = TypeVar("K")

MIN_RING = 64
"""Slots of an empty ring."""


class KeyRing(Generic[K]):
    """A FIFO of keys with batch push, peek and take at C level."""

    __slots__ = ("_head", "_ring", "_size")

    def __init__(self) -> None:
        self._ring: list[K | None] = [None] * MIN_RING  # None: a free slot
        self._head = 0  # the slot of the oldest entry
        self._size = 0  # entries queued, from _head on (wrapping)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[K]:
        """Every entry, oldest first."""
        ring, head = self._ring, self._head
        end = head + self._size
        wrapped = islice(ring, 0, max(0, end - len(ring)))
        return cast(Iterator[K], chain(islice(ring, head, end), wrapped))

    def front(self) -> K:
        """The oldest entry (the ring must not be empty)."""
        return cast(K, self._ring[self._head])

    def push(self, key: K) -> None:
        """Queue one key as the newest entry."""
        size = self._size
        if size == len(self._ring):
            self._grow(size + 1)
        ring = self._ring
        ring[(self._head + size) % len(ring)] = key
        self._size = size + 1

    def push_all(self, keys: Iterable[K]) -> None:
        """Queue keys, in order, as the newest entries."""
        batch = keys if isinstance(keys, (list, tuple)) else list(keys)
        n = len(batch)
        if not n:
            return
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

    def peek(self, n: int) -> list[K]:
        """The ``n`` oldest entries (fewer when fewer are queued), left queued."""
        n = min(n, self._size)
        ring, head = self._ring, self._head
        end = head + n
        if end <= len(ring):
            return cast(list[K], ring[head:end])
        return cast(list[K], ring[head:] + ring[: end - len(ring)])

    def take(self, n: int) -> list[K]:
        """Dequeue and return the ``n`` oldest entries (``n`` at most those queued),
        freeing their slots."""
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

    def pop(self) -> K:
        """Dequeue and return the oldest entry (the ring must not be empty)."""
        ring, head = self._ring, self._head
        key = ring[head]
        ring[head] = None
        self._head = (head + 1) % len(ring)
        self._size -= 1
        return cast(K, key)

    def rebuild(self, entries: list[K]) -> None:
        """Queue ``entries`` alone, from slot 0, in a ring of the same size or more."""
        cap = max(len(self._ring), len(entries))
        self._ring = [*entries, *([None] * (cap - len(entries)))]
        self._head = 0
        self._size = len(entries)

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
