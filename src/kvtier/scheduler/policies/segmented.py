"""``SegmentedPolicy``: the shared part of policies whose blocks live in several lists.

ARC keeps resident blocks in T1 and T2, segmented LRU in probation and protected. A
block is in exactly one segment; removing or releasing it goes to that segment. Each
segment is a ``RecencyList`` or a ``GhostedList`` (ARC's T1, sharing its table with
B1): both park held blocks, so eviction stays proportional to the blocks evicted.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Iterator, Sequence
from itertools import chain
from typing import Protocol

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld


class Segment(Protocol):
    """What a segment answers: ``RecencyList`` and ``GhostedList`` do."""

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def keys(self) -> Iterator[BlockHash]: ...

    def remove(self, key: BlockHash) -> None: ...

    def remove_found(self, keys: Sequence[BlockHash]) -> list[BlockHash]: ...

    def release(self, key: BlockHash) -> None: ...

    def release_all(self, keys: Sequence[BlockHash]) -> None: ...

    def coldest(
        self, n: int, is_held: IsHeld, protected: Collection[BlockHash]
    ) -> list[BlockHash] | None: ...

    def evictable(
        self, is_held: IsHeld, protected: Collection[BlockHash]
    ) -> Generator[BlockHash, None, None]: ...


class SegmentedPolicy(EvictionPolicy):
    """A policy over disjoint segments; subclasses decide where blocks go and who is evicted.

    Args:
        capacity: the tier's capacity in blocks.
        segments: the recency lists, each resident block in exactly one of them.
    """

    def __init__(self, capacity: int, segments: Sequence[Segment]) -> None:
        super().__init__(capacity)
        self._segments = tuple(segments)

    def __len__(self) -> int:
        return sum(len(segment) for segment in self._segments)

    def __contains__(self, key: object) -> bool:
        return any(key in segment for segment in self._segments)

    def keys(self) -> Iterator[BlockHash]:
        return chain.from_iterable(segment.keys() for segment in self._segments)

    def _segment(self, key: BlockHash) -> Segment:
        for segment in self._segments:  # a plain loop: this runs once per block moved
            if key in segment:
                return segment
        raise KeyError(key)

    def remove(self, key: BlockHash) -> None:
        self._segment(key).remove(key)

    def remove_all(self, keys: Sequence[BlockHash]) -> None:
        """``remove`` each key (distinct, each resident): one pass per segment
        in the usual case, where the keys share one segment (or the first few hold
        them all), and no membership test beforehand."""
        rest = keys
        for segment in self._segments:
            rest = segment.remove_found(rest)
            if not rest:
                return
        raise KeyError(rest[0])

    def release(self, key: BlockHash) -> None:
        self._segment(key).release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        for segment in self._segments:  # a key parked in none of them needs nothing
            segment.release_all(keys)

    def _coldest_in_order(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        order: Sequence[Segment],
    ) -> list[BlockHash] | None:
        """``n`` evictable blocks, the coldest of ``order[0]`` first, then of each next
        segment in turn; ``None`` when they hold fewer."""
        victims = order[0].coldest(n, is_held, protected)
        if victims is not None:
            return victims
        victims = []
        for segment in order:
            candidates = segment.evictable(is_held, protected)
            try:
                for key in candidates:
                    victims.append(key)
                    if len(victims) == n:
                        return victims
            finally:
                candidates.close()
        return None
