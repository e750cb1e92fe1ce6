"""Segmented LRU with ghost admission: one-time blocks stay on probation.

Runs in the scheduler; pure Python. Most offloaded blocks are never used again (on the
Mooncake synthetic trace 58 % of distinct blocks are referenced once), and under LRU
each of them pushes a reusable block out. This policy keeps two recency lists and a
ghost list, after SLRU (Karedla et al., 1994) and S3-FIFO's ghost queue (Yang et al.,
SOSP'23)::

    evicted first ─► probation (LRU)  ─► protected (LRU, ≤ 90 % of the tier) ─► evicted last
                        ▲   │ reuse                 │ overflow: demoted to
                  new key   └──────────────────────►│ probation's hot end
                            ghost (keys only, 4 × capacity) ──► a returning key
                                                                 enters protected

* A new block enters *probation*. A second use (``touch`` with ``reused=True``)
  promotes it to *protected*. Recency-only touches (a block still being stored) move
  it within its list, so a request's first block stays its most recent.
* Victims come from probation first, coldest first; protected blocks are evicted only
  when probation has nothing evictable. When protected outgrows its share it demotes
  its coldest block to probation's hot end (it gets one more chance).
* Evicted keys are remembered, without data, in a bounded FIFO ghost list. A key stored
  again while it is a ghost has been used before, so it enters protected directly --
  that is how blocks whose reuse distance exceeds the tier still get in.

Tuned on the synthetic trace and the generated chat workload (``docs/simulate.md``):
protected share 0.9 and ghost 4 × capacity. Probation and the ghosts share one table
(``GhostedList``, ``policies/ghosted.py``): an incoming key's ghost test and its insert
probe the same slot, and an evicted probation block becomes a ghost in place. Held
blocks (being stored, or pinned) are never offered, as with every policy (both lists
park them).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.ghosted import GhostedList
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy

PROTECTED_SHARE = 0.9
"""Protected blocks at most, as a share of the tier (the rest is probation)."""

GHOST_FACTOR = 4
"""Ghost keys remembered, as a multiple of the tier's capacity."""


class SegmentedLRUPolicy(SegmentedPolicy):
    """Probation and protected LRU lists, with a ghost list for admission to protected."""

    name = "slru"

    def __init__(
        self,
        capacity: int,
        lists: tuple[GhostedList[BlockHash], RecencyList[BlockHash]] | None = None,
    ) -> None:
        """``lists``: the probation (with its ghosts) and protected lists, empty
        (default: plain ones; the adaptive policy passes timed ones)."""
        self._probation, self._protected = lists or (GhostedList(), RecencyList())
        super().__init__(capacity, (self._probation, self._protected))
        self._ghost = self._probation.ghosts
        self._protected_cap = max(1, int(capacity * PROTECTED_SHARE))
        self._ghost_cap = max(1, GHOST_FACTOR * capacity)

    @property
    def sizes(self) -> tuple[int, int, int]:
        """``(|probation|, |protected|, |ghost|)``, for tests and diagnostics."""
        return len(self._probation), len(self._protected), len(self._ghost)

    def add(self, key: BlockHash) -> None:
        self._enter(key)

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        if self._ghost.isdisjoint(keys):  # the usual case: all new, to probation
            self._probation.add_all(keys)
        else:
            for key in keys:
                self._enter(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        self._use(key, reused)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        protected = self._protected
        done = protected.touch_listed(keys)  # the usual case: all protected, touched at once
        if done == len(keys):
            return
        keys = keys[done:]  # the first ones were touched as key by key would
        if not isinstance(storing, (set, frozenset)) or not storing.isdisjoint(keys):
            self._use_each(keys, storing)  # some touches are recency only
            return
        # Every key is reused: each probation key moves to protected's hot end, and each
        # move past the cap demotes protected's coldest block to probation's hot end.
        unique = dict.fromkeys(keys)
        promoted = self._probation.members(unique)
        n_demoted = len(protected) + len(promoted) - self._protected_cap  # protected <= cap
        demoted = protected.first_n(max(0, n_demoted))
        if len(demoted) < n_demoted or not unique.keys().isdisjoint(demoted):
            self._use_each(keys, storing)  # a block touched now would be demoted
            return
        # No demoted block is touched, so the blocks demoted one move at a time are the
        # coldest protected ones before the moves, in order; probation loses the
        # promoted blocks and gains the demoted ones at its hot end.
        self._probation.remove_all(promoted)
        protected.move_all_to_end(keys)
        protected.transfer(demoted, self._probation)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        return self._coldest_in_order(n, is_held, protected, (self._probation, self._protected))

    def evict(self, victims: Sequence[BlockHash]) -> None:
        # Every victim becomes a ghost, in order: probation's in place (one C-level
        # pass when they are its coldest), protected's leave protected.
        from_protected = self._probation.bury(victims, all_ghosts=True)
        if from_protected:
            self._protected.remove_all(from_protected)
        ghost = self._ghost
        ghost.pop_oldest(len(ghost) - self._ghost_cap)

    def _enter(self, key: BlockHash) -> None:
        """``add``'s move: a returning ghost to protected, a new key to probation."""
        if key in self._ghost:
            self._ghost.remove(key)
            self._protect(key)
        else:
            self._probation.add(key)

    def _use(self, key: BlockHash, reused: bool) -> None:
        """``touch``'s move: a reused probation block is promoted; others move within."""
        if key in self._probation:
            if reused:
                self._probation.remove(key)
                self._protect(key)
            else:
                self._probation.touch(key)
        elif key in self._protected:
            self._protected.touch(key)

    def _use_each(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        for key in keys:
            self._use(key, key not in storing)

    def _protect(self, key: BlockHash) -> None:
        """Make ``key`` the most recent protected block; demote overflow to probation."""
        self._protected.add(key)
        if len(self._protected) > self._protected_cap:
            self._protected.transfer([self._protected.first()], self._probation)
