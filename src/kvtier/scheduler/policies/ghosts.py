"""``GhostList``: keys recently evicted, without data, dropped oldest first.

Runs in the scheduler; pure Python. ARC's B1 and B2 and segmented LRU's ghost list
are FIFO queues of keys with a membership test: a key joins when its block is evicted,
leaves when its block is stored again (it "returns"), and the oldest go when the list
outgrows its bound. Those lists hold up to four times the tier's blocks, so each of
their operations is a cache miss on a large table; a set and a queue of entries do
them with about a third of the work of an ``OrderedDict`` (no linked node per key).
The queue is a ring: one list, the index of its oldest entry and the count queued::

    _ring:  [k4, - | k2, k3, k2'] (wraps)   _head = 2, _size = 4: k2, k3, k2', k4
    _keys:  {k3, k2', k4}                   (the ghosts now)
    _stale: {k2: 1}                         (k2 returned: its first entry is dead)

Adding a batch is one or two slice assignments and one ``set.update``; dropping the
``n`` oldest is one or two slices, as many assignments of None (the keys are let go
at once, while in cache) and one ``set.difference_update``: C-level passes, no call
per key. The ring grows by half when full, moving only pointers (no key's reference
count is touched, unlike a copy: +12 misses per block for ``slru``, whose ghosts grow
through the bench). No
object is kept per batch: a list per eviction, kept until dropped, made the cyclic
garbage collector run, and traverse the tier's large tables, within the bench's
counted stores (~30 more cache misses per block); a list cut at its front moved and
reallocated its entries (~0.6 more per block for ``arc``).

A key that returns leaves ``_keys`` at once but its entry stays queued, counted in
``_stale``; entries of a key are queued oldest first, so its stale ones are its first
ones, and dropping the oldest skips them. The queue is rebuilt when stale entries make
up half of it, so it stays within twice the list plus a constant.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import cast

from kvtier.blocks import BlockHash

COMPACT_SLACK = 64
"""Stale entries allowed beyond the list's own size before the queue is rebuilt."""

MIN_RING = 64
"""Slots of an empty ring."""


class GhostList:
    """A FIFO of evicted keys with O(1) membership, removal and dropping the oldest."""

    __slots__ = ("_head", "_keys", "_ring", "_size", "_stale")

    def __init__(self) -> None:
        self._keys: set[BlockHash] = set()
        self._ring: list[BlockHash | None] = [None] * MIN_RING  # None: a free slot
        self._head = 0  # the slot of the oldest entry
        self._size = 0  # entries queued, live and stale, from _head on (wrapping)
        self._stale: dict[BlockHash, int] = {}  # key -> its dead entries queued

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[BlockHash]:
        """The ghosts, oldest first."""
        dead = dict(self._stale)
        for key in self._entries():
            if dead.get(key):
                dead[key] -= 1
            else:
                yield key

    def _entries(self) -> Iterator[BlockHash]:
        """Every queued entry, live or stale, oldest first."""
        ring, head = self._ring, self._head
        end = head + self._size
        wrapped = islice(ring, 0, max(0, end - len(ring)))
        return cast(Iterator[BlockHash], chain(islice(ring, head, end), wrapped))

    def isdisjoint(self, keys: Iterable[BlockHash]) -> bool:
        """Whether none of ``keys`` is a ghost (one C-level pass; none when there are
        no ghosts: a set's ``isdisjoint`` of a list would still hash every key)."""
        ghosts = self._keys
        return not ghosts or ghosts.isdisjoint(keys)

    def update(self, keys: Iterable[BlockHash]) -> None:
        """Add keys, in order, as the newest ghosts (none may be a ghost already)."""
        batch = keys if isinstance(keys, (list, tuple)) else list(keys)
        n = len(batch)
        if not n:
            return
        self._keys.update(batch)
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

    def remove(self, key: BlockHash) -> None:
        """Take out a ghost (its block is stored again)."""
        self._keys.remove(key)
        stale = self._stale
        stale[key] = stale.get(key, 0) + 1
        if self._size > 2 * len(self._keys) + COMPACT_SLACK:
            self._rebuild(list(self))
            stale.clear()

    def discard(self, key: BlockHash) -> None:
        """``remove`` the key if it is a ghost."""
        if key in self._keys:
            self.remove(key)

    def pop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest ghosts (none when ``n <= 0``; at most ``len(self)``)."""
        keys, stale = self._keys, self._stale
        while n > 0:
            taken = self._take(n)
            if not stale or stale.keys().isdisjoint(taken):  # all live: the usual case
                keys.difference_update(taken)  # one C-level pass
                return
            for key in taken:  # some entries are dead ones (a key's come first)
                dead = stale.get(key)
                if dead:
                    if dead == 1:
                        del stale[key]
                    else:
                        stale[key] = dead - 1
                else:
                    keys.remove(key)
                    n -= 1

    def _take(self, n: int) -> list[BlockHash]:
        """Dequeue and return the ``n`` oldest entries, live or stale (``n`` at most
        those queued), freeing their slots."""
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
        return cast(list[BlockHash], taken)

    def _grow(self, need: int) -> None:
        """Make room for ``need`` entries or more (by half): free slots go in just
        after the newest entry, so the entries keep their order. Only pointers move:
        copying the entries into a new list would touch (count references to) every
        queued key, a cache miss each."""
        ring, head = self._ring, self._head
        extra = max(need + need // 2, MIN_RING) - len(ring)
        if head + self._size <= len(ring):  # not wrapped: room at the end
            ring.extend([None] * extra)
        else:  # wrapped: room between the newest entries (at the start) and the oldest
            ring[head:head] = [None] * extra
            self._head = head + extra

    def _rebuild(self, entries: list[BlockHash]) -> None:
        """Queue ``entries`` alone, from slot 0, in a ring of the same size."""
        ring = self._ring
        self._ring = [*entries, *([None] * (len(ring) - len(entries)))]
        self._head = 0
        self._size = len(entries)
