"""Follow the leader: the tier keeps what the best of LRU, ARC and SLRU would keep.

Runs in the scheduler; pure Python. No fixed policy wins everywhere (``docs/simulate.md``):
LRU is best when every block's next use is near (chat turns, re-asked documents), ARC
or a segmented LRU when most blocks are used once and the reused ones come back from
far. This policy runs each of them, unchanged, as a keys-only *shadow* of the tier and
makes the tier hold what the best shadow of the moment holds::

    observe(keys) ──► each shadow (a real lru / arc / slru policy over keys only)
                      serves the request as the manager would: prefix hit counted,
                      resident keys used, missing keys stored (its own evictions)
    the tier's blocks ──► kept  (the leader shadow holds it)   evicted last, by recency
                     └──► extra (the leader shadow evicted it)  evicted first, in the
                                                                order the leader evicted

It follows LRU first. After each window of ``max(WINDOW_MIN, capacity // WINDOW_DIV)``
looked-up keys every shadow's score is decayed by ``DECAY`` and its prefix hits are added; the
tier follows the shadow with the best score, switching only when it beats the current
leader's by the share ``MARGIN`` (a switch re-sorts the tier's blocks into kept and
extra: O(capacity), at most once per window, so O(``WINDOW_DIV``) per looked-up key
amortized). Tuned on the 13 workloads of
``benchmarks/policy_cells.py`` (``docs/simulate.md``).

Cost: every request is served by three full-size shadows at lookup (29-45x LRU's
lookup per block; touch up to 2.2x, store with eviction up to 1.5x, ``docs/simulate.md``);
sampling them for large tiers is not done yet: a sampled shadow cannot say which of
the tier's blocks its policy holds, so the tier could not follow it in step.

The manager calls ``observe`` at lookup, before it touches or stores the
request's blocks, so the leader has already evicted what the tier will: in step, the
tier's victims are exactly the leader's, and its hits are the leader's hits.

Eviction cost: both lists are ``RecencyList``s (held blocks are parked), so it is
proportional to the blocks evicted, not to the blocks pinned.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.arc import ARCPolicy
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy

CANDIDATES: tuple[type[EvictionPolicy], ...] = (LRUPolicy, ARCPolicy, SegmentedLRUPolicy)
"""The policies the shadows run; the first leads until another scores better."""

DECAY = 0.75
"""Weight of the past at each decision (the scores remember about four windows)."""

MARGIN = 0.0
"""Share of the leader's score a challenger must lead by to take over (ties keep it)."""

START = 0
"""Index in ``CANDIDATES`` of the shadow the tier follows first."""

WINDOW_MIN = 8192
"""Looked-up keys between decisions at least (else ``capacity // WINDOW_DIV``)."""

WINDOW_DIV = 4
"""Large tiers decide every quarter capacity's worth of looked-up keys, so a lead that
shows late is followed sooner: windows of a whole capacity cost the synthetic trace
0.06 points at 25 % and 0.11 at 50 % (``docs/simulate.md``)."""


def _never_held(key: BlockHash) -> bool:
    return False


class _Shadow:
    """One candidate policy over keys only, fed whole requests the manager's way."""

    __slots__ = ("capacity", "hits", "policy", "resident")

    def __init__(self, cls: type[EvictionPolicy], capacity: int) -> None:
        self.capacity = capacity
        self.policy = cls(capacity)
        self.resident: set[BlockHash] = set()
        self.hits = 0

    def request(self, keys: Sequence[BlockHash]) -> tuple[list[BlockHash], list[BlockHash]]:
        """Serve one lookup; return ``(evicted, stored)`` keys."""
        resident, policy = self.resident, self.policy
        hit = 0
        for key in keys:
            if key not in resident:
                break
            hit += 1
        self.hits += hit
        touch = policy.touch
        for key in reversed(keys):
            if key in resident:
                touch(key, True)
        rest = keys[hit:]
        to_store = [key for key in dict.fromkeys(rest) if key not in resident]
        evicted: list[BlockHash] = []
        if not to_store or len(to_store) > self.capacity:
            return evicted, []
        need = len(resident) + len(to_store) - self.capacity
        if need > 0:
            protected = set(rest)
            victims = policy.choose_victims(need, _never_held, protected, to_store)
            if victims is None:
                return evicted, []
            policy.evict(victims)
            resident.difference_update(victims)
            evicted = victims
        policy.add_all(to_store)
        resident.update(to_store)
        stored = set(to_store)
        for key in reversed(keys):
            if key in resident:
                touch(key, key not in stored)
        return evicted, to_store


class LeaderPolicy(SegmentedPolicy):
    """The tier follows whichever of LRU, ARC and SLRU has hit most lately."""

    name = "leader"

    def __init__(self, capacity: int) -> None:
        self._kept: RecencyList[BlockHash] = RecencyList()
        self._extra: RecencyList[BlockHash] = RecencyList()
        super().__init__(capacity, (self._extra, self._kept))
        self._shadows = tuple(_Shadow(cls, capacity) for cls in CANDIDATES)
        self._scores = [0.0] * len(self._shadows)
        self._leader = START
        self._window = max(WINDOW_MIN, capacity // WINDOW_DIV)
        self._left = self._window

    @property
    def leader(self) -> str:
        """The name of the policy the tier follows now."""
        return self._shadows[self._leader].policy.name

    @property
    def sizes(self) -> tuple[int, int]:
        """``(|extra|, |kept|)``, for tests and diagnostics."""
        return len(self._extra), len(self._kept)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if not keys:
            return
        kept, extra = self._kept, self._extra
        for i, shadow in enumerate(self._shadows):
            evicted, stored = shadow.request(keys)
            if i == self._leader:
                for key in evicted:
                    if key in kept:
                        kept.remove(key)
                        extra.add(key)
                for key in stored:
                    if key in extra:
                        extra.remove(key)
                        kept.add(key)
        self._left -= len(keys)
        if self._left <= 0:
            self._decide()

    def _decide(self) -> None:
        scores = self._scores
        for i, shadow in enumerate(self._shadows):
            scores[i] = scores[i] * DECAY + shadow.hits
            shadow.hits = 0
        best = max(range(len(scores)), key=scores.__getitem__)
        if scores[best] > scores[self._leader] * (1 + MARGIN):
            self._leader = best
            self._resort()
        self._left = self._window

    def _resort(self) -> None:
        """Split the tier's blocks anew into kept and extra for the new leader."""
        holds = self._shadows[self._leader].resident
        kept, extra = self._kept, self._extra
        for key in [key for key in kept.ordered() if key not in holds]:
            kept.remove(key)
            extra.add(key)
        for key in [key for key in extra.ordered() if key in holds]:
            extra.remove(key)
            kept.add(key)

    def add(self, key: BlockHash) -> None:
        if key in self._shadows[self._leader].resident:
            self._kept.add(key)
        else:
            self._extra.add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._kept:
            self._kept.touch(key)
        elif key in self._extra:
            self._extra.touch(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        return self._coldest_in_order(n, is_held, protected, (self._extra, self._kept))

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            self.remove(key)
