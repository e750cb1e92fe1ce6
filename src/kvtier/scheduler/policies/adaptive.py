"""Adaptive segmented LRU: the protected share is chosen online by set-dueling.

Runs in the scheduler; pure Python. No fixed policy wins everywhere: LRU is best when
every block's next use is near (chat turns, re-asked documents), a segmented LRU when
most blocks are used once and the reused ones come back from far (Mooncake's trace,
agents on long shared tool prompts). Both are one structure -- a probation and a
protected recency list, as in ``slru`` -- differing only in how much of the tier the
protected list may hold: at share 0 a reused block is demoted at once to probation's
hot end, which is exactly LRU; at 0.9 it is ``slru``.

This policy runs that structure for the whole tier and lets the traffic pick the
share, by *set-dueling* (Qureshi et al., ISCA'07) with *spatially sampled shadows*
(SHARDS, Waldspurger et al., FAST'15)::

    every reference ──► the tier (probation + protected, protected ≤ share × capacity)
         │ request sampled (1 in R, by its first key)
         └──► shadow SLRU caches of capacity/R, one per candidate share, keys only
              each counts its hits; every ``window`` sampled references the tier
              takes the share of the shadow with the most (decayed) hits

A reference is a store (``add``) or a use (``touch`` with ``reused``). ``R`` is
``sampling.sample_rate(capacity)``: 1 (full-size shadows) under 65,536 blocks, else
the largest power of two that leaves each shadow at least 8,192 keys (at most 256);
a request is sampled by a CRC-32 of its first key (``sampling.is_sampled``).

When the share shrinks, protected holds more than its share; until it is back
within it, each victim is the older, by last use, of the two lists' coldest blocks
(every block's last use is kept, as its value in its list: ``policies/timed.py``), and
at share 0 a reused block or a returning ghost goes to probation's hot end -- so share 0
evicts as LRU does from the first eviction after the switch, and no call pays more
than its own evictions. Eviction, pins and ghosts are ``slru``'s (held blocks are
parked; eviction stays O(evicted)).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.sampling import is_sampled, sample_rate
from kvtier.scheduler.policies.slru import GHOST_FACTOR, PROTECTED_SHARE, SegmentedLRUPolicy
from kvtier.scheduler.policies.timed import TimedGhostedList, TimedRecencyList
from kvtier.scheduler.serve import serve_request

SHARES = (0.0, 0.25, 0.5, 0.75, 0.9)
"""Candidate protected shares (0.0 is LRU, 0.9 is ``slru``)."""

WINDOW_FACTOR = 1
"""Sampled references between decisions, as a multiple of a shadow's capacity."""

DECAY = 0.875
"""Weight of the past at each decision (the scores remember about eight windows)."""


class _Shadow:
    """A keys-only copy of the tier's rules at one share, served requests by
    ``serve.serve_request``.

    As the tier serves a request: the prefix hit is counted, the resident keys are used
    again (the first key last, so it ends up the most recent), and the missing ones are
    stored (a ghost enters protected). Values are last-use times, as the tier keeps
    them. Two simplifications, the same for every share: each stored key evicts as it
    enters (the coldest block, even one of the request), and the request is used only
    once -- its second use, after the store, is skipped.
    """

    __slots__ = (
        "_cap",
        "_clock",
        "_ghost",
        "_ghost_cap",
        "_prob",
        "_prot",
        "_prot_max",
        "_share_cap",
        "_used",
        "hits",
    )

    def __init__(self, capacity: int, share: float) -> None:
        self._cap = capacity
        self._share_cap = int(capacity * share)
        self._prot_max = max(1, int(capacity * PROTECTED_SHARE))
        self._ghost_cap = GHOST_FACTOR * capacity
        self._prob: OrderedDict[BlockHash, int] = OrderedDict()
        self._prot: OrderedDict[BlockHash, int] = OrderedDict()
        self._ghost: OrderedDict[BlockHash, None] = OrderedDict()
        self._clock = 0
        self._used = False  # the request has been used since its lookup
        self.hits = 0

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        prob, prot = self._prob, self._prot
        hit = 0
        for key in block_hashes:
            if key not in prot and key not in prob:
                break
            hit += 1
        self.hits += hit
        self._used = False
        return hit

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        if self._used:  # its second use is skipped (class docstring)
            return
        self._used = True
        prob, prot = self._prob, self._prot
        clock = self._clock
        for key in reversed(block_hashes):  # a use of every resident key
            if key in prot:
                clock += 1
                prot[key] = clock
                prot.move_to_end(key)
            elif key in prob:
                del prob[key]
                clock += 1
                self._protect(key, clock)
        self._clock = clock

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> StoredKeys:
        prob, prot, ghost = self._prob, self._prot, self._ghost
        stored = []
        clock = self._clock
        for key in block_hashes:
            if key in prot or key in prob:
                continue
            stored.append(key)
            clock += 1
            if key in ghost:
                del ghost[key]
                self._protect(key, clock)
            else:
                prob[key] = clock
            if len(prob) + len(prot) > self._cap:
                self._evict_one()
        self._clock = clock
        while len(ghost) > self._ghost_cap:
            ghost.popitem(last=False)
        return StoredKeys(stored)

    def complete_store(self, block_hashes: Sequence[BlockHash]) -> None:
        """Stored keys are resident at once: nothing to complete."""

    def _protect(self, key: BlockHash, clock: int) -> None:
        prot = self._prot
        prot[key] = clock
        if len(prot) > self._prot_max:
            demoted, used = prot.popitem(last=False)
            self._prob[demoted] = used

    def _evict_one(self) -> None:
        prob, prot = self._prob, self._prot
        if not prob or (
            len(prot) > self._share_cap and next(iter(prot.values())) < next(iter(prob.values()))
        ):
            victim, _ = prot.popitem(last=False)
        else:
            victim, _ = prob.popitem(last=False)
        self._ghost[victim] = None


@dataclass(frozen=True, slots=True)
class StoredKeys:
    """What a shadow's ``prepare_store`` stored."""

    block_hashes_to_store: list[BlockHash]


class AdaptivePolicy(SegmentedLRUPolicy):
    """``slru``'s structure with the protected share picked by sampled shadows."""

    name = "adaptive"

    def __init__(self, capacity: int) -> None:
        # Both lists stamp each add and touch from one clock: the blocks' last uses.
        self._clock = itertools.count()
        self._timed: tuple[TimedGhostedList[BlockHash], TimedRecencyList[BlockHash]] = (
            TimedGhostedList(self._clock),
            TimedRecencyList(self._clock),
        )
        super().__init__(capacity, self._timed)
        rate = sample_rate(capacity)
        self._mask = rate - 1
        shadow_cap = max(1, capacity // rate)
        self._shadows = tuple(_Shadow(shadow_cap, share) for share in SHARES)
        self._scores = [0.0] * len(SHARES)
        self._window = max(64, WINDOW_FACTOR * shadow_cap)
        self._left = self._window
        # Start as slru: while the tier fills nothing is evicted, so the share costs
        # nothing yet, and the reused blocks are already in protected if it wins.
        self._leader = len(SHARES) - 1
        self._share_cap = int(capacity * SHARES[self._leader])

    @property
    def share(self) -> float:
        """The protected share the tier follows now."""
        return SHARES[self._leader]

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if keys and is_sampled(keys, self._mask):
            for shadow in self._shadows:
                serve_request(shadow, keys)
            self._left -= len(keys)
            if self._left <= 0:
                self._decide()

    def _decide(self) -> None:
        """Take the share of the shadow with the most (decayed) prefix hits."""
        scores = self._scores
        for i, shadow in enumerate(self._shadows):
            scores[i] = scores[i] * DECAY + shadow.hits
            shadow.hits = 0
        best = max(range(len(scores)), key=scores.__getitem__)
        if scores[best] > scores[self._leader]:  # ties keep the current share
            self._leader = best
            self._share_cap = int(self.capacity * SHARES[best])
        self._left = self._window

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        excess = len(self._protected) - self._share_cap
        if excess <= 0:
            return super().choose_victims(n, is_held, protected, incoming)
        # Protected is over the share: the older (by last use) of the two lists'
        # coldest blocks goes until it is back within it -- at share 0, LRU's victim.
        probation, protected_list = self._timed
        from_prob = probation.evictable(is_held, protected)
        from_prot = protected_list.evictable(is_held, protected)
        victims: list[BlockHash] = []
        try:
            a, b = next(from_prob, None), next(from_prot, None)
            while len(victims) < n:
                if b is not None and (
                    a is None or (excess > 0 and protected_list.time(b) < probation.time(a))
                ):
                    victims.append(b)
                    excess -= 1
                    b = next(from_prot, None)
                elif a is not None:
                    victims.append(a)
                    a = next(from_prob, None)
                else:
                    return None
        finally:
            from_prob.close()
            from_prot.close()
        return victims
