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
* ``first_<n>``: the first decision after ``n`` windows;
* ``efirst_<k>``: ``EARLY`` = ``k`` until the first switch away from ``START``;
* ``window_<n>``: another ``WINDOW_MIN``;
* ``sigother_<k>``: ``SIGNIFICANCE`` ``k`` for SLRU and branch challengers;
* several at once, joined by ``+`` (``window_16384+early_3``).

The hedge's variants (``hedgeshare_``, ``hedgesig_``, the round-9 ``hedgestart``,
``hedgeswitch``, ...) went with the hedge in the tenth round; ``8dfc987``'s copy of
this file has them. Run from the repository root::

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

    if variant == "rebuilt_r1":
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
    elif variant.startswith("significance_"):
        leader.SIGNIFICANCE = float(variant.removeprefix("significance_"))
    elif variant.startswith("efirst_"):  # another EARLY until the first switch
        _early_first(float(variant.removeprefix("efirst_")))
    elif variant.startswith("sigother_"):  # SIGNIFICANCE k for SLRU / branch challengers
        _sig_other(float(variant.removeprefix("sigother_")))
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
