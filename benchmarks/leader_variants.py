"""``leader`` variants on issue 14's 65 cells, against ``policy_cells.json``'s lru/arc.

Replays ``leader`` with one change made in the worker processes, on the workloads and
capacities of ``policy_cells.py``, and prints per workload the hit blocks minus
max(lru, arc) and minus the shipped ``leader``'s (both read from the JSON, which must
be from the same commit's cell run). Variants:

* ``rebuilt_r1``: the sampled mode's tier (a real instance of the leader's policy,
  rebuilt at a switch) at every capacity, with full-size shadows (R = 1);
* ``sampled_<n>``: sampling at every capacity that leaves shadows of >= ``n`` keys;
* ``margin_<x>``, ``decay_<x>``, ``early_<x>``, ``significance_<x>``: another
  ``MARGIN``, ``DECAY``, ``EARLY`` or ``SIGNIFICANCE`` (``early_inf``: the rule
  without ``EARLY`` decisions; ``significance_0``: the rule before ``SIGNIFICANCE``,
  where the best decayed score leads);
* ``hedgeshare_<x>``, ``hedgesig_<x>``: another ``HEDGE_SHARE`` or
  ``HEDGE_SIGNIFICANCE`` (``hedgesig_inf``: the tier never follows the hedge, the
  rule before it);
* ``first_<n>``: the first decision after ``n`` windows;
* ``efirst_<k>``: ``EARLY`` = ``k`` until the first switch away from ``START``;
* ``window_<n>``: another ``WINDOW_MIN``;
* the round-9 screens of the hedge's use (``docs/simulate.md``, none kept):
  ``hedgestart`` (the tier follows the hedge from the start), ``hedgeswitch`` (after
  every change of leader), ``hedgefirst`` (after the first), ``hedgeswitchpair`` (after
  a change that leaves LRU and ARC the pair), ``hedgeswitchbetter`` (after a change,
  if the hedge's decayed score beats the new leader's), ``hedgeprobation`` (for one
  window after a change), ``hedgeback_<k>`` (back to the leader on a lead of ``k``
  standard deviations), ``hedgepair_<k>`` (``HEDGE_SIGNIFICANCE`` ``k`` while the pair is
  LRU and ARC), ``sigother_<k>`` (``SIGNIFICANCE`` ``k`` for SLRU and branch
  challengers);
* several at once, joined by ``+`` (``window_16384+early_3``).

Run from the repository root::

    PYTHONPATH=src nice python benchmarks/leader_variants.py rebuilt_r1 [CELLS_JSON]

``CELLS_JSON`` (default ``benchmarks/results/policy_cells.json``): the cell run to
compare with, e.g. one of other seeds (``policy_cells.py --seeds 4,5``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policy_cells as pc

from kvtier.sim.replay import replay

_PATCHED: set[str] = set()
"""The variants this process has patched in (a worker runs several jobs: a wrapping
patch applied twice would wrap itself)."""


def _patch(variants: str) -> None:
    if variants in _PATCHED:
        return
    _PATCHED.add(variants)
    for variant in variants.split("+"):
        _patch_one(variant)


def _patch_one(variant: str) -> None:
    from kvtier.scheduler.policies import leader, sampling

    if variant == "rebuilt_r1":  # (a rebuilt tier cannot follow the hedge)
        leader.HEDGE_SIGNIFICANCE = float("inf")
        init = leader.LeaderPolicy.__init__

        def rebuilt(self: leader.LeaderPolicy, capacity: int) -> None:
            init(self, capacity)
            self._tier = leader._Rebuilt(capacity, self._shadows[self._leader])

        leader.LeaderPolicy.__init__ = rebuilt  # type: ignore[method-assign]
    elif variant.startswith("first_"):  # the first decision after n windows
        windows = int(variant.removeprefix("first_"))
        init = leader.LeaderPolicy.__init__

        def later(self: leader.LeaderPolicy, capacity: int) -> None:
            init(self, capacity)
            self._left = windows * self._window

        leader.LeaderPolicy.__init__ = later  # type: ignore[method-assign]
    elif variant.startswith("margin_"):
        leader.MARGIN = float(variant.removeprefix("margin_"))
    elif variant.startswith("window_"):
        leader.WINDOW_MIN = int(variant.removeprefix("window_"))
    elif variant.startswith("early_"):
        leader.EARLY = float(variant.removeprefix("early_"))
    elif variant.startswith("decay_"):
        leader.DECAY = float(variant.removeprefix("decay_"))
    elif variant.startswith("hedgeshare_"):
        leader.HEDGE_SHARE = float(variant.removeprefix("hedgeshare_"))
    elif variant.startswith("hedgesig_"):
        leader.HEDGE_SIGNIFICANCE = float(variant.removeprefix("hedgesig_"))
    elif variant.startswith("significance_"):
        leader.SIGNIFICANCE = float(variant.removeprefix("significance_"))
    elif variant.startswith("efirst_"):  # another EARLY until the first switch
        _early_first(float(variant.removeprefix("efirst_")))
    elif variant == "hedgestart":  # the tier follows the hedge from the start
        _hedge_start()
    elif variant == "hedgeswitch":  # the tier follows the hedge after each switch
        _hedge_switch(pairs=False)
    elif variant == "hedgeswitchpair":  # the same, only between LRU and ARC
        _hedge_switch(pairs=True)
    elif variant.startswith("sigother_"):  # SIGNIFICANCE k for SLRU / branch challengers
        _sig_other(float(variant.removeprefix("sigother_")))
    elif variant == "hedgefirst":  # ... after the first switch only
        _hedge_switch(pairs=False, first=True)
    elif variant == "hedgeswitchbetter":  # ... after a switch, if it scores better
        _hedge_switch(pairs=False, better=True)
    elif variant == "hedgeprobation":  # the hedge for one window after a switch
        _hedge_probation()
    elif variant.startswith("hedgeback_"):  # another bar for going back to the leader
        _hedge_back(float(variant.removeprefix("hedgeback_")))
    elif variant.startswith("hedgepair_"):  # HEDGE_SIGNIFICANCE k while the pair is LRU, ARC
        _hedge_pair(float(variant.removeprefix("hedgepair_")))
    elif variant.startswith("sampled_"):
        sampling.FULL_SHADOWS_BELOW = 0
        sampling.SAMPLED_SHADOW_BLOCKS = int(variant.removeprefix("sampled_"))
    else:
        raise SystemExit(f"unknown variant {variant!r}")


def _early_first(k: float) -> None:
    """``efirst_<k>``: ``EARLY`` = ``k`` until the tier first leaves ``START`` (a leader
    no evidence chose), the shipped ``EARLY`` after."""
    from kvtier.scheduler.policies import leader

    clear, decide = leader.LeaderPolicy._clear_lead, leader.LeaderPolicy._decide
    shipped = leader.EARLY

    def cleared(self: leader.LeaderPolicy) -> bool:
        leader.EARLY = shipped if getattr(self, "_left_start", False) else k
        try:
            return clear(self)
        finally:
            leader.EARLY = shipped

    def decided(self: leader.LeaderPolicy, clear: bool) -> None:
        decide(self, clear)
        if self._leader != leader.START:
            self._left_start = True

    leader.LeaderPolicy._clear_lead = cleared  # type: ignore[method-assign]
    leader.LeaderPolicy._decide = decided  # type: ignore[method-assign]


def _hedge_start() -> None:
    """``hedgestart``: the tier follows the hedge (``_hedged``) from the start, until the
    leader leads it by ``HEDGE_SIGNIFICANCE`` standard deviations."""
    from kvtier.scheduler.policies import leader

    init = leader.LeaderPolicy.__init__

    def hedged(self: leader.LeaderPolicy, capacity: int) -> None:
        init(self, capacity)
        if self._hedge is not None:
            self._hedged = True
            self._follow()

    leader.LeaderPolicy.__init__ = hedged  # type: ignore[method-assign]


def _hedge_switch(pairs: bool, better: bool = False, first: bool = False) -> None:
    """``hedgeswitch``: after each change of leader the tier follows the hedge (between
    the new leader and the runner-up), until the leader leads it significantly;
    ``hedgeswitchpair``: only when the two are LRU and ARC; ``hedgeswitchbetter``:
    only when the hedge's decayed score beats the new leader's (no significance; a
    tier that follows the hedge goes on following it)."""
    from kvtier.scheduler.policies import leader

    decide, test = leader.LeaderPolicy._decide, leader.LeaderPolicy._test_hedge

    def decided(self: leader.LeaderPolicy, clear: bool) -> None:
        self._switching = self._leader
        try:
            decide(self, clear)
        finally:
            self._switching = None

    def tested(self: leader.LeaderPolicy, scores: list[float], spread: float) -> None:
        before = getattr(self, "_switching", None)
        if before is not None and before != self._leader:
            takes = not (first and getattr(self, "_switched", False))
            takes = takes and (not pairs or {self._leader, self._runner} == {0, 1})
            takes = takes and (not better or scores[len(self._shadows)] > scores[self._leader])
            if takes:
                self._hedged = True
            self._switched = True
        test(self, scores, spread)

    leader.LeaderPolicy._decide = decided  # type: ignore[method-assign]
    leader.LeaderPolicy._test_hedge = tested  # type: ignore[method-assign]


def _sig_other(k: float) -> None:
    """``sigother_<k>``: ``SIGNIFICANCE`` = ``k`` for a challenger that is neither LRU nor
    ARC (the issue's measure), the shipped bar for those two."""
    from kvtier.scheduler.policies import leader

    challenger, shipped = leader.LeaderPolicy._challenger, leader.SIGNIFICANCE

    def challenged(
        self: leader.LeaderPolicy, scores: list[float], clear: bool = False
    ) -> int | None:
        best = max(range(len(self._shadows)), key=scores.__getitem__)
        leader.SIGNIFICANCE = shipped if best in (0, 1) else k
        try:
            return challenger(self, scores, clear)
        finally:
            leader.SIGNIFICANCE = shipped

    leader.LeaderPolicy._challenger = challenged  # type: ignore[method-assign]


def _hedge_probation() -> None:
    """``hedgeprobation``: after a change of leader the tier follows the hedge until the
    next decision, then the hedge only on the shipped evidence."""
    from kvtier.scheduler.policies import leader

    decide, test = leader.LeaderPolicy._decide, leader.LeaderPolicy._test_hedge

    def decided(self: leader.LeaderPolicy, clear: bool) -> None:
        self._switching = self._leader
        try:
            decide(self, clear)
        finally:
            self._switching = None

    def tested(self: leader.LeaderPolicy, scores: list[float], spread: float) -> None:
        before = getattr(self, "_switching", None)
        if before is not None:  # a decision
            if before != self._leader:
                self._hedged = self._probation = True
            elif getattr(self, "_probation", False):
                self._hedged = self._probation = False
        test(self, scores, spread)

    leader.LeaderPolicy._decide = decided  # type: ignore[method-assign]
    leader.LeaderPolicy._test_hedge = tested  # type: ignore[method-assign]


def _hedge_back(k: float) -> None:
    """``hedgeback_<k>``: the tier goes back from the hedge to the leader once the
    leader's score leads the hedge's by ``k`` standard deviations (not the shipped
    ``HEDGE_SIGNIFICANCE``, which still takes it to the hedge)."""
    from kvtier.scheduler.policies import leader

    test, shipped = leader.LeaderPolicy._test_hedge, leader.HEDGE_SIGNIFICANCE

    def tested(self: leader.LeaderPolicy, scores: list[float], spread: float) -> None:
        leader.HEDGE_SIGNIFICANCE = k if self._hedged else shipped
        try:
            test(self, scores, spread)
        finally:
            leader.HEDGE_SIGNIFICANCE = shipped

    leader.LeaderPolicy._test_hedge = tested  # type: ignore[method-assign]


def _hedge_pair(k: float) -> None:
    """``hedgepair_<k>``: ``HEDGE_SIGNIFICANCE`` = ``k`` while the leader and the runner-up
    are LRU and ARC (the issue's measure), the shipped bar otherwise."""
    from kvtier.scheduler.policies import leader

    test, shipped = leader.LeaderPolicy._test_hedge, leader.HEDGE_SIGNIFICANCE

    def tested(self: leader.LeaderPolicy, scores: list[float], spread: float) -> None:
        pair = {self._leader, self._runner} == {0, 1}
        leader.HEDGE_SIGNIFICANCE = k if pair else shipped
        try:
            test(self, scores, spread)
        finally:
            leader.HEDGE_SIGNIFICANCE = shipped

    leader.LeaderPolicy._test_hedge = tested  # type: ignore[method-assign]


def _job(args: tuple[str, str]) -> tuple[str, list[int]]:
    workload, variant = args
    _patch(variant)
    trace = pc._trace(workload)
    caps = [round(share * trace.num_distinct_blocks) for share in pc.SHARES]
    return workload, [replay(trace, cap, "leader").ratios.hit_blocks for cap in caps]


def main() -> None:
    variant = sys.argv[1]
    cells = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/policy_cells.json"
    doc = json.loads(Path(cells).read_text())
    rows = {row["workload"]: row for row in doc["rows"]}
    start = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(_job, [(w, variant) for w in rows]))
    counts = [0, 0, 0]
    net = lost = 0
    for workload, hits in results:
        ref = rows[workload]["hit_blocks"]
        best = [max(a, b) for a, b in zip(ref["lru"], ref["arc"], strict=True)]
        diffs = [h - b for h, b in zip(hits, best, strict=True)]
        in_step = [h - b for h, b in zip(hits, ref["leader"], strict=True)]
        for d in diffs:
            counts[0 if d > 0 else 1 if d == 0 else 2] += 1
        net += sum(diffs)
        lost += sum(d for d in diffs if d < 0)
        print(f"{workload:>16}: vs max(lru, arc) {diffs}  vs shipped leader {in_step}")
    load = os.getloadavg()
    print(
        f"{variant}: above {counts[0]}, equal {counts[1]}, below {counts[2]}; "
        f"net {net:+,}, lost {lost:+,}; "
        f"{time.perf_counter() - start:.0f} s, load average {load[0]:.2f}"
    )


if __name__ == "__main__":
    main()
