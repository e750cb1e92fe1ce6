"""Least recently used: evict the block whose last use is oldest."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.recency import RecencyList


class LRUPolicy(EvictionPolicy):
    """One recency list; every touch, reuse or not, makes a block the most recent."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._list: RecencyList[BlockHash] = RecencyList()

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, key: object) -> bool:
        return key in self._list

    def keys(self) -> Iterator[BlockHash]:
        return self._list.keys()

    def add(self, key: BlockHash) -> None:
        self._list.add(key)

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        self._list.add_all(keys)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        self._list.release_all(keys)

    def touch(self, key: BlockHash, reused: bool) -> None:
        self._list.touch(key)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        self._list.touch_all(keys)  # a reuse or not, the same move

    def remove(self, key: BlockHash) -> None:
        self._list.remove(key)

    def release(self, key: BlockHash) -> None:
        self._list.release(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        return self._list.coldest(n, is_held, protected)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        missing = self._list.remove_found(victims)
        if missing:
            raise KeyError(missing[0])
