"""``LeadSwitch``: when the ``leader`` policy's tier changes the shadow it follows.

Runs in the scheduler; pure Python. The shadows' prefix hits are counted over
*windows* of looked-up keys. At the end of a window every shadow's score is decayed
by ``decay`` and its window's hits are added; the tier follows the shadow with the
best score, but a challenger takes over only on a *significant* lead: its score must
beat the leader's by the share ``margin`` and by more than ``significance`` standard
deviations -- the square root of the sum, over the requests, of the squared
difference of the two shadows' hits in each, every window's weighted by the square of
its scores' weight (``decay`` squared per window, kept for every pair of shadows, so
that it holds across changes of leader)::

    lead = score[challenger] - score[leader]        (decayed, this window included)
    spread = sum over requests of (hits[challenger] - hits[leader]) ** 2, decayed
    switch when lead > margin * score[leader] and lead ** 2 > significance ** 2 * spread

The test runs after every request that moves a lead, on the scores as they would be
were the window to end there, and a significant lead ends the window at once. A
window also ends early once a challenger's hits in it lead the leader's by more than
``early`` standard deviations of this window's differences alone; that decision takes
the best score without the significance test. Over n requests a lead is at most
sqrt(n) standard deviations (Cauchy-Schwarz), so ``early`` = 4 decides after 17
requests at the soonest, and ``significance`` = 1 after two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.scheduler.policies.shadow import ShadowTier

_ROUNDING = 1 + 1e-9
"""A lead within rounding of ``significance`` standard deviations is not significant:
one request's difference alone is exactly one standard deviation, at every decay
after it, and the decays' rounding would decide it either way."""


@dataclass(frozen=True, slots=True)
class SwitchRule:
    """The switching rule's parameters (``leader``'s module constants).

    Attributes:
        window: looked-up keys between decisions (> 0).
        decay: weight of the past scores at each decision.
        margin: share of the leader's score a challenger must lead by.
        significance: standard deviations of lead a challenger needs at a decision.
        early: standard deviations of lead within a window that end it early.
    """

    window: int
    decay: float
    margin: float
    significance: float
    early: float


class LeadSwitch:
    """Scores the shadows' hits and says when the tier's leader changes.

    The shadows count their hits in ``ShadowTier.hits``; a decision resets them.
    """

    def __init__(self, shadows: Sequence[ShadowTier], rule: SwitchRule, start: int) -> None:
        self._shadows = shadows
        self._rule = rule
        self.leader = start  # the index of the shadow the tier follows
        n = len(shadows)
        self._scores = [0.0] * n
        self._pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        self._pair: dict[tuple[int, int], int] = {}
        for p, (i, j) in enumerate(self._pairs):
            self._pair[i, j] = self._pair[j, i] = p
        # per pair of shadows: this window's sum of squared per-request hit
        # differences, and the decayed sum of the past windows'
        self._squares = [0] * len(self._pairs)
        self._spreads = [0.0] * len(self._pairs)
        self._left = rule.window

    def record(self, n: int, gains: list[int] | None) -> int | None:
        """Account one request of ``n`` looked-up keys; ``gains``: each shadow's hits in
        it (``None``: every shadow hit all ``n``). Returns the new leader's index when
        the request ends a window with a switch, else ``None``."""
        self._left -= n
        if gains is None or gains.count(gains[0]) == len(gains):
            # No lead moved, so no early decision: after the last request (or after the
            # decision it made, which decays a lead and its spread alike) neither test
            # held, and no difference changed.
            return self._decide(clear=False) if self._left <= 0 else None
        squares = self._squares
        for p, (i, j) in enumerate(self._pairs):
            squares[p] += (gains[i] - gains[j]) ** 2
        if self._left <= 0:
            return self._decide(clear=False)
        if self._clear_lead():
            return self._decide(clear=True)
        if self._challenger(self._decayed()) is not None:
            return self._decide(clear=False)
        return None

    def _clear_lead(self) -> bool:
        """Whether a challenger leads the leader by more than ``early`` standard
        deviations in this window (integers: the test is exact)."""
        lead = self.leader
        own = self._shadows[lead].hits
        bar = self._rule.early * self._rule.early
        squares, pair = self._squares, self._pair
        for i, shadow in enumerate(self._shadows):
            ahead = shadow.hits - own
            if ahead > 0 and ahead * ahead > bar * squares[pair[i, lead]]:
                return True
        return False

    def _decayed(self) -> list[float]:
        """The scores as a decision now would make them."""
        decay = self._rule.decay
        return [
            score * decay + shadow.hits
            for score, shadow in zip(self._scores, self._shadows, strict=True)
        ]

    def _challenger(self, scores: list[float], clear: bool = False) -> int | None:
        """The shadow that takes the lead at a decision with these scores, if any: the
        first best, if it beats the leader's by ``margin`` and (unless ``clear``, an
        ``early`` decision) by ``significance`` standard deviations."""
        rule, lead = self._rule, self.leader
        best = max(range(len(self._shadows)), key=scores.__getitem__)
        ahead = scores[best] - scores[lead]
        if best == lead or scores[best] <= scores[lead] * (1 + rule.margin):
            return None
        if clear:
            return best
        p = self._pair[best, lead]
        spread = self._spreads[p] * (rule.decay * rule.decay) + self._squares[p]
        bar = rule.significance * rule.significance * spread * _ROUNDING
        return best if ahead * ahead > bar else None

    def _decide(self, clear: bool) -> int | None:
        """End the window: decay the scores and spreads, reset the window's hits, and
        switch to the challenger, if one wins."""
        scores = self._scores = self._decayed()
        best = self._challenger(scores, clear)
        weight = self._rule.decay * self._rule.decay
        spreads = self._spreads
        for p, square in enumerate(self._squares):
            spreads[p] = spreads[p] * weight + square
        for shadow in self._shadows:
            shadow.hits = 0
        self._left = self._rule.window
        self._squares = [0] * len(self._pairs)
        if best is None or best == self.leader:
            return None
        self.leader = best
        return best
