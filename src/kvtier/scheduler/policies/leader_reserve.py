"""``Reserve``: blocks an in-step ``leader`` tier keeps although its leader evicted them.

Runs in the scheduler; pure Python. While every shadow hits alike, nothing tells LRU's
choice of victims from ARC's, and the blocks only the frequency-keeping shadows
(the *guards*: ARC, SLRU) hold are the ones a tier following LRU loses to ARC. So
while an in-step tier follows its first leader (LRU) it keeps up to ``size`` blocks
of *extra* (those the leader evicted) that a guard holds, and evicts instead LRU's
coldest blocks that no guard holds. The tier gives the reserve up for good at the
first request on which a guard hits less than the leader, or the tier does, and at the
first switch (``LeaderPolicy.observe``); from then on its victims are the leader's.

Which blocks go first, while reserving: the leader's evicted blocks that no guard
holds (coldest first); the reserved blocks past ``size``, least reused first (then
coldest); the leader's coldest blocks that no guard holds, among its ``scan`` coldest
per victim needed (plus 64); the other reserved blocks; the leader's coldest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from itertools import filterfalse, islice, repeat

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.recency import RecencyList


class Reserve:
    """What the reserve keeps: its size, the guards' keys and each block's reuses.

    Args:
        size: blocks of extra a guard holds that the tier keeps (> 0).
        guards: the guards' ``resident`` sets (read, never changed).
        scan: coldest blocks of the leader's looked at per victim for one no guard
            holds, before a reserved block goes.
    """

    __slots__ = ("_guards", "_scan", "_uses", "size")

    def __init__(self, size: int, guards: Sequence[set[BlockHash]], scan: int) -> None:
        self.size = size
        self._guards = guards
        self._scan = scan
        self._uses: Counter[BlockHash] = Counter()  # reuses of each block

    def count_use(self, key: BlockHash) -> None:
        """A reuse of ``key``."""
        self._uses[key] += 1

    def count_uses(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        """A reuse of each of ``keys`` not being stored (a touch of those is not one)."""
        self._uses.update(filterfalse(storing.__contains__, keys) if storing else keys)

    def forget(self, keys: Sequence[BlockHash]) -> None:
        """``keys`` left the tier."""
        uses = self._uses
        if uses:
            for key in keys:
                uses.pop(key, None)

    def victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        extra: RecencyList[BlockHash],
        kept: RecencyList[BlockHash],
    ) -> list[BlockHash] | None:
        """``n`` victims among ``extra`` (the blocks the leader evicted) and ``kept``
        (those it holds), in the order of the module docstring; ``None`` if fewer."""
        guards = self._guards
        coldest = extra.coldest(n, is_held, protected)
        if coldest is not None and all(map(set.isdisjoint, guards, repeat(coldest))):
            return coldest  # the usual case: extra's coldest are unguarded

        def guarded(key: BlockHash) -> bool:
            return any(key in guard for guard in guards)

        victims: list[BlockHash] = []
        reserved: list[BlockHash] = []  # coldest first
        search = extra.evictable(is_held, protected)
        for key in search:
            if guarded(key):
                reserved.append(key)
                continue
            victims.append(key)
            if len(victims) == n:
                search.close()
                return victims
        search.close()
        over = len(reserved) - self.size
        if over > 0:
            reserved = self._least_reused(reserved)
            victims += reserved[: min(over, n - len(victims))]
            reserved = reserved[over:]
        if len(victims) < n:
            need = n - len(victims)
            search = kept.evictable(is_held, protected)
            coldest = list(islice(search, self._scan * need + 64))
            search.close()
            victims += list(islice(filterfalse(guarded, coldest), need))
        if len(victims) < n and reserved:
            if over <= 0:
                reserved = self._least_reused(reserved)
            victims += reserved[: n - len(victims)]
        if len(victims) < n:
            chosen = set(victims)
            search = kept.evictable(is_held, protected)
            victims += list(islice(filterfalse(chosen.__contains__, search), n - len(victims)))
            search.close()
        return victims if len(victims) == n else None

    def _least_reused(self, keys: list[BlockHash]) -> list[BlockHash]:
        """``keys`` (coldest first) least reused first; the sort is stable, so the
        coldest first among equals (sorted only when some are taken)."""
        return sorted(keys, key=self._uses.__getitem__)  # a Counter: 0 if never reused
