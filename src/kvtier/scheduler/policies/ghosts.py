"""``GhostList``: keys recently evicted, without data, dropped oldest first.

Runs in the scheduler; pure Python. ARC's B1 and B2 and segmented LRU's ghost list
are FIFO queues of keys with a membership test: a key joins when its block is evicted,
leaves when its block is stored again (it "returns"), and the oldest go when the list
outgrows its bound. Those lists hold up to four times the tier's blocks, so each of
their operations is a cache miss on a large table; a set and a queue of entries do
them with about a third of the work of an ``OrderedDict`` (no linked node per key).
Keys join in batches (one eviction's victims) and leave in batches, so the queue is a
deque of those batches, each a list, with how far the oldest one has been dropped::

    _chunks: oldest ─► [k1, k2 | k3, k2'] [k4, ...] ─► newest   (_head = 1: k1 dropped)
    _keys:   {k3, k2', k4, ...}                                  (the ghosts now)
    _stale:  {k2: 1}                        (k2 returned: its first entry is dead)

Adding a batch is one list copy and one ``set.update``; dropping the ``n`` oldest is a
slice of the first batch or two and one ``set.difference_update`` (C-level passes, no
call per key). A key that returns leaves ``_keys`` at once but its entry stays queued,
counted in ``_stale``; entries of a key are queued oldest first, so its stale ones are
its first ones, and dropping the oldest skips them. The queue is rebuilt when stale
entries make up half of it, so it stays within twice the list plus a constant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, islice

from kvtier.blocks import BlockHash

COMPACT_SLACK = 64
"""Stale entries allowed beyond the list's own size before the queue is rebuilt."""


class GhostList:
    """A FIFO of evicted keys with O(1) membership, removal and dropping the oldest."""

    __slots__ = ("_chunks", "_head", "_keys", "_queued", "_stale")

    def __init__(self) -> None:
        self._keys: set[BlockHash] = set()
        self._chunks: deque[list[BlockHash]] = deque()  # batches of entries, oldest first
        self._head = 0  # entries of _chunks[0] already dropped
        self._queued = 0  # entries queued (live and stale): sum of chunk lengths - _head
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
        chunks = iter(self._chunks)
        first = next(chunks, None)
        if first is None:
            return iter(())
        return chain(islice(first, self._head, None), chain.from_iterable(chunks))

    def isdisjoint(self, keys: Iterable[BlockHash]) -> bool:
        """Whether none of ``keys`` is a ghost (one C-level pass; none when there are
        no ghosts: a set's ``isdisjoint`` of a list would still hash every key)."""
        ghosts = self._keys
        return not ghosts or ghosts.isdisjoint(keys)

    def update(self, keys: Iterable[BlockHash]) -> None:
        """Add keys, in order, as the newest ghosts (none may be a ghost already)."""
        batch = list(keys)  # a copy: the caller's list may change later
        if batch:
            self._keys.update(batch)
            self._chunks.append(batch)
            self._queued += len(batch)

    def remove(self, key: BlockHash) -> None:
        """Take out a ghost (its block is stored again)."""
        self._keys.remove(key)
        stale = self._stale
        stale[key] = stale.get(key, 0) + 1
        if self._queued > 2 * len(self._keys) + COMPACT_SLACK:
            live = list(self)
            self._chunks = deque([live] if live else [])
            self._head = 0
            self._queued = len(live)
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
        those queued): a slice of the oldest batch or two, or the whole batch."""
        chunks, head = self._chunks, self._head
        self._queued -= n
        first = chunks[0]
        if head == 0 and len(first) == n:  # whole batches in, whole batches out
            return chunks.popleft()
        taken: list[BlockHash] = []
        while True:
            end = head + n - len(taken)
            if end < len(first):
                taken += first[head:end]
                self._head = end
                return taken
            taken += first[head:] if head else first
            chunks.popleft()
            head = 0
            if len(taken) == n:
                self._head = 0
                return taken
            first = chunks[0]
