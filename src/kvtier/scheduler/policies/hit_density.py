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

Classes are many and some see few blocks, so each class's counts are shrunk toward
the pool of all classes' counts: ``PRIOR_EVENTS`` pseudo-events spread as the pool's
are. A class with few events ranks near the average class, one with many by its own
counts: ranked by their own counts alone, classes that saw a few blocks rank on noise,
and the policy fell below max(LRU, ARC) in many more replayed cells.

A bucket no block of the class reached has, but for the pool's share, no evidence and
a density near 0 -- the blocks there are the oldest of their class, and LHD evicts them
first. Between such blocks, ``rank`` puts those of *dead* classes first: a class whose
density at age 0 (over its whole life) is under ``DEAD_SHARE`` of the best class's,
e.g. the blocks of a conversation's last turn, which no later request continues.
"""

from __future__ import annotations

BUCKETS = 128
"""Age buckets per class; older ages count in the last one."""

DECAY = 0.97
"""Weight of the past counts at each update."""

DEAD_SHARE = 0.1
"""A class is dead while its density at age 0 is below this share of the best one's."""

PRIOR_EVENTS = 20.0
"""Pseudo-events of the pool of all classes added to each class's counts (shrinkage)."""

NEGLIGIBLE = 1e-9
"""Events in all classes' decayed counts below which an update changes nothing (about
700 updates without a hit or an eviction after the last one)."""


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

    def hit(self, cls: int, age: int) -> None:
        """A block of ``cls`` was used again at ``age``."""
        self._hits[cls][min(age // self.width, BUCKETS - 1)] += 1.0

    def evicted(self, cls: int, age: int) -> None:
        """A block of ``cls`` was evicted at ``age``."""
        self._evictions[cls][min(age // self.width, BUCKETS - 1)] += 1.0

    def density(self, cls: int, age: int) -> float:
        """The density of a block of ``cls`` at ``age``, as of the last update (for
        tests and diagnostics; the policy ranks by ``rank``)."""
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
        """Recompute every table from the counts, then decay the counts.

        Each class's counts are shrunk toward the pool of all classes' by
        ``PRIOR_EVENTS`` pseudo-events spread as the pool's are: a class with few
        events ranks near the average class, one with many by its own; a class with
        none has the pool's table (computed once) -- not an all-zero one, which would
        evict its blocks first so that it never showed a hit. Only classes with
        events of their own set the ``alive_floor``.
        """
        pool_hits = [sum(column) for column in zip(*self._hits, strict=True)]
        pool_evictions = [sum(column) for column in zip(*self._evictions, strict=True)]
        pool = sum(pool_hits) + sum(pool_evictions)
        if pool < NEGLIGIBLE:
            # nothing happened yet (every class keeps the LRU order), or nothing for so
            # long that the decayed counts say nothing: the tables stay as they are
            # (decayed on, ``PRIOR_EVENTS / pool`` would overflow and zero them all)
            return
        weight = PRIOR_EVENTS / pool
        prior_hits = [weight * count for count in pool_hits]
        prior_evictions = [weight * count for count in pool_evictions]
        zeros = [0.0] * BUCKETS
        pool_table = [0.0] * BUCKETS
        _fill(pool_table, prior_hits, prior_evictions, zeros, zeros)
        best = 0.0
        for hits, evictions, table in zip(self._hits, self._evictions, self._tables, strict=True):
            if not (any(hits) or any(evictions)):
                table[:] = pool_table
                continue
            _fill(table, prior_hits, prior_evictions, hits, evictions)
            best = max(best, table[0])
            hits[:] = [count * DECAY for count in hits]
            evictions[:] = [count * DECAY for count in evictions]
        self.alive_floor = DEAD_SHARE * best


def _fill(
    table: list[float],
    prior_hits: list[float],
    prior_evictions: list[float],
    hits: list[float],
    evictions: list[float],
) -> None:
    """``table[a]``: the density at bucket ``a`` of the summed counts (one backward
    pass: each later event adds one bucket of time to every earlier bucket)."""
    hits_after = events_after = time_after = 0.0
    for bucket in range(BUCKETS - 1, -1, -1):
        hit = prior_hits[bucket] + hits[bucket]
        hits_after += hit
        events_after += hit + prior_evictions[bucket] + evictions[bucket]
        time_after += events_after
        table[bucket] = hits_after / time_after if time_after > 0 else 0.0
