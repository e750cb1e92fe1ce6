"""``GhostList``: keys recently evicted, without data, dropped oldest first.

Runs in the scheduler; pure Python. ARC's B1 and B2 and segmented LRU's ghost list
are FIFO queues of keys with a membership test: a key joins when its block is evicted,
leaves when its block is stored again (it "returns"), and the oldest go when the list
outgrows its bound. Those lists hold up to four times the tier's blocks, so each of
their operations is a cache miss on a large table; a set and a deque do them with
about a third of the work of an ``OrderedDict`` (no linked node per key)::

    _fifo:  oldest ─► [k1, k2, k3, k2', k4] ─► newest     (a deque of keys)
    _keys:  {k1, k3, k2', k4}                              (the ghosts now)
    _stale: {k2: 1}                                        (k2 returned: its first entry is dead)

A key that returns leaves ``_keys`` at once but its entry stays in the deque, counted
in ``_stale``; entries of a key are in the deque oldest first, so its stale ones are
its first ones, and dropping the oldest skips them. The deque is rebuilt when stale
entries make up half of it, so it stays within twice the list plus a constant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice, repeat, starmap

from kvtier.blocks import BlockHash

COMPACT_SLACK = 64
"""Stale entries allowed beyond the list's own size before the deque is rebuilt."""


class GhostList:
    """A FIFO of evicted keys with O(1) membership, removal and dropping the oldest."""

    __slots__ = ("_fifo", "_keys", "_stale")

    def __init__(self) -> None:
        self._keys: set[BlockHash] = set()
        self._fifo: deque[BlockHash] = deque()
        self._stale: dict[BlockHash, int] = {}  # key -> its dead entries in _fifo

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[BlockHash]:
        """The ghosts, oldest first."""
        dead = dict(self._stale)
        for key in self._fifo:
            if dead.get(key):
                dead[key] -= 1
            else:
                yield key

    def isdisjoint(self, keys: Iterable[BlockHash]) -> bool:
        """Whether none of ``keys`` is a ghost (one C-level pass)."""
        return self._keys.isdisjoint(keys)

    def update(self, keys: Iterable[BlockHash]) -> None:
        """Add keys, in order, as the newest ghosts (none may be a ghost already)."""
        keys = keys if isinstance(keys, list) else list(keys)
        self._keys.update(keys)
        self._fifo.extend(keys)

    def remove(self, key: BlockHash) -> None:
        """Take out a ghost (its block is stored again)."""
        self._keys.remove(key)
        stale = self._stale
        stale[key] = stale.get(key, 0) + 1
        if len(self._fifo) > 2 * len(self._keys) + COMPACT_SLACK:
            self._fifo = deque(self)
            stale.clear()

    def discard(self, key: BlockHash) -> None:
        """``remove`` the key if it is a ghost."""
        if key in self._keys:
            self.remove(key)

    def pop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest ghosts (none when ``n <= 0``; at most ``len(self)``)."""
        if n < 1:
            return
        fifo, keys, stale = self._fifo, self._keys, self._stale
        if not stale or stale.keys().isdisjoint(islice(fifo, n)):  # the n oldest are live
            keys.difference_update(starmap(fifo.popleft, repeat((), n)))  # one C-level pass
            return
        while n:
            key = fifo.popleft()
            dead = stale.get(key)
            if dead:  # this entry is one of the key's dead ones (they come first)
                if dead == 1:
                    del stale[key]
                else:
                    stale[key] = dead - 1
            else:
                keys.remove(key)
                n -= 1
