"""``InStepTier``: a ``leader`` tier whose shadows are its size and see every request.

Runs in the scheduler; pure Python. The tier's blocks sit in two recency lists::

    kept:  the leading shadow holds the block
    extra: it evicted the block (or never stored it)

Victims come from extra first, then kept, coldest first. The manager calls
``observe`` at lookup, before it touches or stores the request's blocks, so the
leading shadow has already evicted what the tier will: in step, the tier's victims
are exactly the leader's. A switch sorts the blocks anew into kept and extra:
O(capacity), at most once per decision. While the tier follows its first leader it
may keep a ``Reserve`` (``policies/leader_reserve.py``) of blocks extra holds that a
frequency-keeping shadow still holds.

Both lists are ``RecencyList``s: held blocks are parked, so eviction costs time
proportional to the blocks evicted, not to the blocks pinned.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.leader_reserve import Reserve
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy
from kvtier.scheduler.policies.shadow import ShadowTier


class InStepTier(SegmentedPolicy):
    """The tier's blocks in *kept* and *extra*, driven by a full-size leading shadow.

    Args:
        capacity: the tier's capacity in blocks.
        leader: the shadow the tier follows first.
        reserve: the reserve kept while it does (``None``: none).
    """

    learns = False  # ``observe`` is the base's: nothing to learn

    def __init__(self, capacity: int, leader: ShadowTier, reserve: Reserve | None = None) -> None:
        self._kept: RecencyList[BlockHash] = RecencyList()
        self._extra: RecencyList[BlockHash] = RecencyList()
        super().__init__(capacity, (self._extra, self._kept))
        self._leader = leader
        self._holds = leader.resident
        self._reserve = reserve

    @property
    def reserve(self) -> int:
        """Blocks the reserve may keep (0: it was given up, or there was none)."""
        return self._reserve.size if self._reserve is not None else 0

    def drop_reserve(self) -> None:
        """Give the reserve up for good: from the next search the tier's victims are
        its leader's again (the reserved blocks first: they are in *extra*)."""
        self._reserve = None

    def holds_all(self, keys: Sequence[BlockHash]) -> bool:
        """Whether the tier holds every key (one pass when kept holds them all)."""
        return self._kept.holds_all(keys) or all(map(self.__contains__, keys))

    @property
    def sizes(self) -> tuple[int, ...]:
        return len(self._extra), len(self._kept)

    @property
    def follows(self) -> str:
        return self._leader.policy.name

    def follow(self, evicted: Sequence[BlockHash], stored: Sequence[BlockHash]) -> None:
        """The leading shadow evicted and stored these keys."""
        kept, extra = self._kept, self._extra
        for key in evicted:
            if key in kept:
                kept.remove(key)
                extra.add(key)
        for key in stored:
            if key in extra:
                extra.remove(key)
                kept.add(key)

    def lead(self, leader: ShadowTier) -> None:
        """Split the tier's blocks anew into kept and extra for a new leader."""
        self.drop_reserve()
        self._leader = leader
        holds = self._holds = leader.resident
        kept, extra = self._kept, self._extra
        for key in [key for key in kept.ordered() if key not in holds]:
            kept.remove(key)
            extra.add(key)
        for key in [key for key in extra.ordered() if key in holds]:
            extra.remove(key)
            kept.add(key)

    def add(self, key: BlockHash) -> None:
        if key in self._holds:
            self._kept.add(key)
        else:
            self._extra.add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._kept:
            self._kept.touch(key)
        elif key in self._extra:
            self._extra.touch(key)
        if reused and self._reserve is not None:
            self._reserve.count_use(key)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        kept, extra = self._kept, self._extra
        done = kept.touch_listed(keys)  # the usual case: all in kept
        for key in keys[done:]:
            if key in kept:
                kept.touch(key)
            elif key in extra:
                extra.touch(key)
        if self._reserve is not None:
            self._reserve.count_uses(keys, storing)

    def remove(self, key: BlockHash) -> None:
        super().remove(key)
        if self._reserve is not None:
            self._reserve.forget([key])

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        if self._reserve is None:
            return self._coldest_in_order(n, is_held, protected, (self._extra, self._kept))
        return self._reserve.victims(n, is_held, protected, self._extra, self._kept)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        self.remove_all(victims)
        if self._reserve is not None:
            self._reserve.forget(victims)
