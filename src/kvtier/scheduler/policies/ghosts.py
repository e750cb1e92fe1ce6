"""``GhostList``: keys recently evicted, without data, dropped oldest first.

Runs in the scheduler; pure Python. ARC's B1 and B2 and segmented LRU's ghost list
are FIFO queues of keys with a membership test: a key joins when its block is evicted,
leaves when its block is stored again (it "returns"), and the oldest go when the list
outgrows its bound. Those lists hold up to four times the tier's blocks, so each of
their operations is a cache miss on a large table; a set and a queue of entries
(``KeyRing``, ``policies/ring.py``) do them with about a third of the work of an
``OrderedDict`` (no linked node per key)::

    queue:  k2, k3, k2', k4                 (oldest first)
    _keys:  {k3, k2', k4}                   (the ghosts now)
    _stale: {k2: 1}                         (k2 returned: its first entry is dead)

Adding a batch is a push to the ring and one ``set.update``; dropping the ``n``
oldest a take from the ring and one ``set.difference_update``: C-level passes, no
call per key.

A key that returns leaves ``_keys`` at once but its entry stays queued, counted in
``_stale``; entries of a key are queued oldest first, so its stale ones are its first
ones, and dropping the oldest skips them. The queue is rebuilt when stale entries make
up half of it, so it stays within twice the list plus a constant.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.ring import KeyRing

COMPACT_SLACK = 64
"""Stale entries allowed beyond the list's own size before the queue is rebuilt."""


class GhostList:
    """A FIFO of evicted keys with O(1) membership, removal and dropping the oldest."""

    __slots__ = ("_keys", "_queue", "_stale")

    def __init__(self) -> None:
        self._keys: set[BlockHash] = set()
        self._queue: KeyRing[BlockHash] = KeyRing()  # entries, live and stale, oldest first
        self._stale: dict[BlockHash, int] = {}  # key -> its dead entries queued

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[BlockHash]:
        """The ghosts, oldest first."""
        dead = dict(self._stale)
        for key in self._queue:
            if dead.get(key):
                dead[key] -= 1
            else:
                yield key

    def isdisjoint(self, keys: Iterable[BlockHash]) -> bool:
        """Whether none of ``keys`` is a ghost (one C-level pass; none when there are
        no ghosts: a set's ``isdisjoint`` of a list would still hash every key)."""
        ghosts = self._keys
        return not ghosts or ghosts.isdisjoint(keys)

    def update(self, keys: Iterable[BlockHash]) -> None:
        """Add keys, in order, as the newest ghosts (none may be a ghost already)."""
        batch = keys if isinstance(keys, (list, tuple)) else list(keys)
        self._keys.update(batch)
        self._queue.push_all(batch)

    def remove(self, key: BlockHash) -> None:
        """Take out a ghost (its block is stored again)."""
        self._keys.remove(key)
        stale = self._stale
        stale[key] = stale.get(key, 0) + 1
        if len(self._queue) > 2 * len(self._keys) + COMPACT_SLACK:
            self._queue.rebuild(list(self))
            stale.clear()

    def discard(self, key: BlockHash) -> None:
        """``remove`` the key if it is a ghost."""
        if key in self._keys:
            self.remove(key)

    def pop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest ghosts (none when ``n <= 0``; at most ``len(self)``)."""
        keys, stale = self._keys, self._stale
        while n > 0:
            taken = self._queue.take(n)
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
