"""``SegmentedPolicy``: the shared part of policies whose blocks live in several lists.

ARC keeps resident blocks in T1 and T2, segmented LRU in probation and protected. A
block is in exactly one segment; removing or releasing it goes to that segment. Each
segment is a ``RecencyList``, so held blocks are parked there and eviction stays
proportional to the blocks evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy
from kvtier.scheduler.policies.recency import RecencyList


class SegmentedPolicy(EvictionPolicy):
    """A policy over disjoint segments; subclasses decide where blocks go and who is evicted.

    Args:
        capacity: the tier's capacity in blocks.
        segments: the recency lists, each resident block in exactly one of them.
    """

    def __init__(self, capacity: int, segments: Sequence[RecencyList[BlockHash]]) -> None:
        super().__init__(capacity)
        self._segments = tuple(segments)

    def __len__(self) -> int:
        return sum(len(segment) for segment in self._segments)

    def _segment(self, key: BlockHash) -> RecencyList[BlockHash]:
        for segment in self._segments:  # a plain loop: this runs once per block moved
            if key in segment:
                return segment
        raise KeyError(key)

    def remove(self, key: BlockHash) -> None:
        self._segment(key).remove(key)

    def release(self, key: BlockHash) -> None:
        self._segment(key).release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        for segment in self._segments:  # a key parked in none of them needs nothing
            segment.release_all(keys)
