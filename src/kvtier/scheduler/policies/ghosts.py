"""``GhostList``: keys recently evicted, without data, dropped oldest first.

Runs in the scheduler; pure Python. ARC's B2 and segmented LRU's ghost list are FIFO
queues of keys with a membership test: a key joins when its block is evicted, leaves
when its block is stored again (it "returns"), and the oldest go when the list
outgrows its bound. Those lists hold up to four times the tier's blocks, so each of
their operations is a cache miss on a large table; a set and a queue of entries
(``EntryQueue``, ``policies/entries.py``) do them with about a third of the work of an
``OrderedDict`` (no linked node per key)::

    _keys:  {k3, k2', k4}                   (the ghosts now)
    _queue: k2 (dead), k3, k2', k4          (k2 returned: its first entry is dead)

Adding a batch is a ``set.update`` and a push of the batch; dropping the ``n`` oldest
a take of the queue's ``n`` oldest live entries and one ``set.difference_update``:
C-level passes, no call per key. ARC's B1 shares its table with T1 instead
(``policies/ghosted.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.entries import EntryQueue


class GhostList:
    """A FIFO of evicted keys with O(1) membership, removal and dropping the oldest."""

    __slots__ = ("_keys", "_queue")

    def __init__(self) -> None:
        self._keys: set[BlockHash] = set()
        self._queue: EntryQueue[BlockHash] = EntryQueue()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[BlockHash]:
        """The ghosts, oldest first."""
        return iter(self._queue)

    def isdisjoint(self, keys: Iterable[BlockHash]) -> bool:
        """Whether none of ``keys`` is a ghost (one C-level pass; none when there are
        no ghosts: a set's ``isdisjoint`` of a list would still hash every key)."""
        ghosts = self._keys
        return not ghosts or ghosts.isdisjoint(keys)

    def update(self, keys: Iterable[BlockHash]) -> None:
        """Add keys, in order, as the newest ghosts (none may be a ghost already)."""
        batch = keys if isinstance(keys, (list, tuple)) else list(keys)
        if batch:
            self._keys.update(batch)
            self._queue.push(batch)

    def remove(self, key: BlockHash) -> None:
        """Take out a ghost (its block is stored again)."""
        self._keys.remove(key)
        self._queue.kill(key)

    def discard(self, key: BlockHash) -> None:
        """``remove`` the key if it is a ghost."""
        if key in self._keys:
            self.remove(key)

    def pop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest ghosts (none when ``n <= 0``; at most ``len(self)``)."""
        if n > 0:
            self._keys.difference_update(self._queue.take_live(n))
