"""``Hedge``: the leader's blocks, but a share of the tier for the runner-up's.

Runs in the scheduler; pure Python. Not registered on its own: ``leader`` runs one as a
keys-only shadow beside its four (``policies/leader.py``) and lets the tier follow it
while it out-hits the leading shadow significantly. It is driven by two other shadows,
the *leader* and the *runner-up*, and keeps its blocks in three recency lists::

    none      neither of the two holds the block        ─► evicted first
    insured   the runner-up holds it, the leader not    ─► next, while over ``share``
    kept      the leader holds it                       ─► then kept, then insured

So with ``share`` 0 it is the leader in step while the lead holds (it evicts what the
leader evicts; after a new ``pair`` its lists keep their own recency order); with a
share it keeps up to ``share`` blocks the leader dropped and the runner-up still holds,
in place of the leader's coldest. Where two policies trade the lead on noise (LRU and
ARC on mixed chats and documents) the union's hottest blocks out-hit either; where one
is really better, the share costs hits, which is why ``leader`` follows a hedge only on
evidence. The two shadows tell it what they evicted and stored (``follow``); a key
whose class changed moves to the hot end of its new list. ``pair`` takes on a new
leader and runner-up: every block is placed again, list by list, coldest first.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence, Set

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy

_NOBODY: frozenset[BlockHash] = frozenset()


class Hedge(SegmentedPolicy):
    """The leader's blocks in step, less ``share`` blocks kept for the runner-up's."""

    name = "hedge"

    def __init__(self, capacity: int, share: int = 0) -> None:
        self._none: RecencyList[BlockHash] = RecencyList()
        self._insured: RecencyList[BlockHash] = RecencyList()
        self._kept: RecencyList[BlockHash] = RecencyList()
        super().__init__(capacity, (self._none, self._insured, self._kept))
        self.share = share
        self._leads: Set[BlockHash] = _NOBODY
        self._backs: Set[BlockHash] = _NOBODY

    @property
    def sizes(self) -> tuple[int, int, int]:
        """``(|none|, |insured|, |kept|)``."""
        return len(self._none), len(self._insured), len(self._kept)

    def _list_for(self, key: BlockHash) -> RecencyList[BlockHash]:
        if key in self._leads:
            return self._kept
        return self._insured if key in self._backs else self._none

    def _place(self, keys: Iterable[BlockHash]) -> None:
        """Move each of ``keys`` that the tier holds to the hot end of its class's list,
        if its class changed."""
        for key in keys:
            want = self._list_for(key)
            if key in want:
                continue
            for segment in (self._none, self._insured, self._kept):
                if segment is not want and key in segment:
                    segment.remove(key)
                    want.add(key)
                    break

    def pair(self, leads: Set[BlockHash], backs: Set[BlockHash]) -> None:
        """Follow a leader holding ``leads`` and a runner-up holding ``backs`` (live
        sets, read at every move): place every block again, each list's coldest first."""
        self._leads, self._backs = leads, backs
        for segment in (self._none, self._insured, self._kept):
            self._place(segment.ordered())

    def follow(self, moved: Iterable[BlockHash]) -> None:
        """The leader or the runner-up evicted or stored these keys."""
        self._place(moved)

    def add(self, key: BlockHash) -> None:
        self._list_for(key).add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        for segment in (self._kept, self._insured, self._none):
            if key in segment:
                segment.touch(key)
                return

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        victims: list[BlockHash] = []
        first_turn: set[BlockHash] = set()  # insured's, which its second turn skips
        over = len(self._insured) - self.share
        for turn, (segment, most) in enumerate(
            ((self._none, n), (self._insured, over), (self._kept, n), (self._insured, n))
        ):
            want = min(n - len(victims), most)
            if want <= 0:
                continue
            candidates = segment.evictable(is_held, protected)
            try:
                for key in candidates:
                    if key not in first_turn:  # a set: a request can bring 30,000 keys
                        victims.append(key)
                        if turn == 1:
                            first_turn.add(key)
                        want -= 1
                        if not want:
                            break
            finally:
                candidates.close()
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        self.remove_all(victims)
