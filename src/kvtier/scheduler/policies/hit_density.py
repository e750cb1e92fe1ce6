"""``HitDensity``: hits per unit of cache time, learned per class of block and age.

Runs in the scheduler; pure Python. The ranking of the ``density`` policy
(``policies/density.py``), after Beckmann, Chen and Cidon's LHD (NSDI'18): a block of
class ``c`` that has gone ``a`` time units without a use is worth

    density(c, a) = expected further hits / expected further time in the cache

both read off what happened to the blocks of class ``c`` that reached age ``a``
before: each was used again (a *hit*) or evicted at some later age. With ``H[x]`` and
``E[x]`` the hits and evictions seen at age ``x``, in buckets of ``width`` time units::

    density(a) = sum(H[x] for x >= a) / sum((x - a + 1) * (H[x] + E[x]) for x >= a)

(one backward pass over the buckets). Ages past the last bucket count in it. Every
``update`` recomputes the tables from the counts, then decays the counts by ``DECAY``,
so the tables follow a workload that changes. Until the first update every class
ranks by age alone (``1 / (bucket + 1)``: LRU).

A bucket no block of the class reached has no evidence and a density of 0 -- the
blocks there are the oldest of their class, and LHD evicts them first. Between such
blocks, ``rank`` puts those of *dead* classes first: a class whose density at age 0
(over its whole life) is under ``DEAD_SHARE`` of the best class's, e.g. the blocks of
a conversation's last turn, which no later request continues.
"""

from __future__ import annotations

BUCKETS = 128
"""Age buckets per class; older ages count in the last one."""

DECAY = 0.97
"""Weight of the past counts at each update."""

DEAD_SHARE = 0.1
"""A class is dead while its density at age 0 is below this share of the best one's."""


class HitDensity:
    """Hit and eviction counts by class and age, and the density tables they give.

    Args:
        classes: number of classes (``0 .. classes - 1``).
        width: time units per age bucket (> 0).
    """

    __slots__ = ("_evictions", "_hits", "_tables", "alive_floor", "width")

    def __init__(self, classes: int, width: int) -> None:
        self.width = width
        self._hits = [[0.0] * BUCKETS for _ in range(classes)]
        self._evictions = [[0.0] * BUCKETS for _ in range(classes)]
        lru = [1.0 / (bucket + 1) for bucket in range(BUCKETS)]
        self._tables = [list(lru) for _ in range(classes)]
        self.alive_floor = 0.0  # density at age 0 a class needs not to be dead

    def bucket(self, age: int) -> int:
        """The bucket of an age (``>= 0``)."""
        return min(age // self.width, BUCKETS - 1)

    def hit(self, cls: int, age: int) -> None:
        """A block of ``cls`` was used again at ``age``."""
        self._hits[cls][min(age // self.width, BUCKETS - 1)] += 1.0

    def evicted(self, cls: int, age: int) -> None:
        """A block of ``cls`` was evicted at ``age``."""
        self._evictions[cls][min(age // self.width, BUCKETS - 1)] += 1.0

    def density(self, cls: int, age: int) -> float:
        """The density of a block of ``cls`` at ``age``, as of the last update."""
        return self._tables[cls][min(age // self.width, BUCKETS - 1)]

    def rank(self, cls: int, age: int) -> tuple[float, bool, int, float]:
        """The eviction rank of a block of ``cls`` at ``age``: the lowest goes first
        (density, then dead classes before live ones, then the oldest, then the
        class of lower density over its whole life)."""
        table = self._tables[cls]
        return (
            table[min(age // self.width, BUCKETS - 1)],
            table[0] >= self.alive_floor,
            -age,
            table[0],
        )

    def update(self) -> None:
        """Recompute the tables of the classes with counts, then decay the counts.

        A class nothing has happened to yet keeps its table (the LRU order of the
        start): a class first seen now must get the time to show its hits, or its
        blocks would go first and it would never show any.
        """
        best = 0.0
        for hits, evictions, table in zip(self._hits, self._evictions, self._tables, strict=True):
            if not (any(hits) or any(evictions)):
                continue
            hits_after = events_after = time_after = 0.0
            for bucket in range(BUCKETS - 1, -1, -1):
                hits_after += hits[bucket]
                events_after += hits[bucket] + evictions[bucket]
                time_after += events_after  # each later event adds one bucket of time
                table[bucket] = hits_after / time_after if time_after > 0 else 0.0
                hits[bucket] *= DECAY
                evictions[bucket] *= DECAY
            best = max(best, table[0])
        self.alive_floor = DEAD_SHARE * best
