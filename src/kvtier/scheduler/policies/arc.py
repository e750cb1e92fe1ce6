"""Adaptive Replacement Cache (Megiddo & Modha, FAST'03), adapted to offloading.

Four lists over a cache of ``c`` blocks:

* ``T1``: resident blocks used once (recency); ``T2``: resident blocks used again.
* ``B1``, ``B2``: ghosts -- keys recently evicted from T1 and T2 (no data).
* ``p``: the target size of T1. A new block whose key is a ghost of B1 says "T1 was
  too small" and grows ``p``; a ghost of B2 shrinks it.

Eviction takes the coldest evictable block of T1 when ``|T1| > p``, else of T2, and
falls back to the other list when the preferred one has nothing evictable (everything
pinned or being stored). Ghost lists are bounded as in the paper:
``|T1| + |B1| <= c`` and ``|T1| + |T2| + |B1| + |B2| <= 2c``.

Offloading differences: blocks enter when they are *stored* (``add``), and a second
use is a ``touch`` of a READY block. Touching a block still being stored is recency
only -- it stays in T1. Keys that are not resident are ignored by ``touch``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.ghosted import GhostedList
from kvtier.scheduler.policies.ghosts import GhostList
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy


class ARCPolicy(SegmentedPolicy):
    """ARC with both ghost lists and an adaptive T1 target."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        # T1 and B1 share one table (``policies/ghosted.py``): an evicted T1 block
        # becomes a B1 ghost by a write in place.
        self._t1: GhostedList[BlockHash] = GhostedList()
        self._t2: RecencyList[BlockHash] = RecencyList()
        super().__init__(capacity, (self._t1, self._t2))
        self._b1 = self._t1.ghosts
        self._b2 = GhostList()
        self.p = 0
        # The last ``incoming`` batch ``choose_victims`` found to hold no ghost; see
        # ``add_all``.
        self._no_ghosts: Sequence[BlockHash] | None = None

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """``(|T1|, |T2|, |B1|, |B2|)``, for tests and diagnostics."""
        return len(self._t1), len(self._t2), len(self._b1), len(self._b2)

    def _adapted(self, p: int, key: BlockHash) -> int:
        if key in self._b1:
            return min(self.capacity, p + max(1, len(self._b2) // len(self._b1)))
        if key in self._b2:
            return max(0, p - max(1, len(self._b1) // len(self._b2)))
        return p

    def add(self, key: BlockHash) -> None:
        self._no_ghosts = None
        if key in self._b1 or key in self._b2:
            # A ghost that comes back has been used before: it goes straight to T2.
            self.p = self._adapted(self.p, key)
            self._b1.discard(key)
            self._b2.discard(key)
            self._t2.add(key)
        else:
            self._t1.add(key)
        self._trim_ghosts()

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        """Add ``keys``, ghosts to T2 and the others to T1.

        When ``keys`` is the very batch the last ``choose_victims`` was given as
        ``incoming`` and found to hold no ghost -- the manager's store: choose, evict,
        add -- they are not looked up again: only ``evict`` adds ghosts, and it adds
        resident keys, which incoming ones are not; an ``add`` in between forgets the
        batch (a key added then could be evicted and become a ghost).
        """
        no_ghosts, self._no_ghosts = self._no_ghosts, None
        if keys is not no_ghosts and not (self._b1.isdisjoint(keys) and self._b2.isdisjoint(keys)):
            for key in keys:
                self.add(key)
        else:  # the common case: all new to T1, ghosts trimmed once
            self._t1.add_all(keys)
            self._trim_ghosts()

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._t1:
            if reused:
                self._t1.remove(key)
                self._t2.add(key)
            else:
                self._t1.touch(key)
        elif key in self._t2:
            self._t2.touch(key)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        done = self._t2.touch_listed(keys)  # the usual case: all in T2, touched at once
        if done == len(keys):
            return
        keys = keys[done:]  # the first ones were touched as key by key would
        if not isinstance(storing, (set, frozenset)) or not storing.isdisjoint(keys):
            super().touch_all(keys, storing)
            return
        # Every key is reused: each leaves T1 (if there) for T2's hot end, in turn.
        self._t1.discard_all(keys)
        self._t2.move_all_to_end(keys)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        p = self.p
        if self._b1.isdisjoint(incoming) and self._b2.isdisjoint(incoming):  # in C
            self._no_ghosts = incoming  # add_all need not look again
        else:
            self._no_ghosts = None
            for new in incoming:  # only a returning ghost moves p
                p = self._adapted(p, new)
        t1 = self._t1
        n1 = len(t1)
        k1 = min(n, n1 - p) if n1 > p else 0  # victims from T1 while |T1| > p
        if k1 == n:  # all from T1: the usual case
            fast = t1.coldest(n, is_held, protected)
        else:
            fast = self._coldest(n, k1, is_held, protected)
        if fast is not None:
            return fast
        from_t1 = self._t1.evictable(is_held, protected)
        from_t2 = self._t2.evictable(is_held, protected)
        n1 = len(self._t1)
        victims: list[BlockHash] = []
        try:
            while len(victims) < n:
                prefer_t1 = n1 > 0 and n1 > p
                first, second = (from_t1, from_t2) if prefer_t1 else (from_t2, from_t1)
                victim = next(first, None)
                if victim is None:  # nothing evictable there: fall back to the other list
                    victim = next(second, None)
                    first = second
                if victim is None:
                    return None
                if first is from_t1:
                    n1 -= 1
                victims.append(victim)
        finally:
            from_t1.close()
            from_t2.close()
        return victims

    def _coldest(
        self, n: int, k1: int, is_held: IsHeld, protected: Collection[BlockHash]
    ) -> list[BlockHash] | None:
        """The victims when no list runs out of evictable blocks: T1's ``k1`` coldest
        (``|T1| - p`` at most), then T2's; ``None`` if a list runs out (the caller
        walks)."""
        from_t1 = self._t1.coldest(k1, is_held, protected) if k1 else []
        from_t2 = self._t2.coldest(n - k1, is_held, protected) if n > k1 else []
        if from_t1 is None or from_t2 is None:
            return None
        return from_t1 + from_t2

    def evict(self, victims: Sequence[BlockHash]) -> None:
        # Each victim leaves its list for that list's ghosts: T1's become B1's in
        # place (one C-level pass when they are T1's coldest, as ``choose`` picks
        # them), then T2's, if any, leave T2 for B2.
        from_t2 = self._t1.bury(victims)
        if from_t2:
            self._t2.remove_all(from_t2)
            self._b2.update(from_t2)
        # No trim: each victim moved from T1 to B1 or from T2 to B2, which leaves
        # |T1| + |B1| and the total as they were, within their bounds.

    def _trim_ghosts(self) -> None:
        c, b1, b2 = self.capacity, self._b1, self._b2
        t1, n_b1 = len(self._t1), len(b1)
        drop = min(n_b1, t1 + n_b1 - c)
        if drop > 0:
            b1.pop_oldest(drop)
            n_b1 -= drop
        n_b2 = len(b2)
        if not n_b2:  # |T1| + |B1| <= c and |T2| <= c: the total is within 2c
            return
        excess = t1 + len(self._t2) + n_b1 + n_b2 - 2 * c
        if excess > 0:  # from B2, then B1 once B2 is empty
            from_b2 = min(excess, n_b2)
            b2.pop_oldest(from_b2)
            b1.pop_oldest(excess - from_b2)
