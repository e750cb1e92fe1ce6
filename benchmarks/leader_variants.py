"""``leader`` variants on issue 14's 65 cells, against ``policy_cells.json``'s lru/arc.

Replays ``leader`` with one change made in the worker processes, on the workloads and
capacities of ``policy_cells.py``, and prints per workload the hit blocks minus
max(lru, arc) and minus the shipped ``leader``'s (both read from the JSON, which must
be from the same commit's cell run). Variants:

* ``rebuilt_r1``: the sampled mode's tier (a real instance of the leader's policy,
  rebuilt at a switch) at every capacity, with full-size shadows (R = 1);
* ``sampled_<n>``: sampling at every capacity that leaves shadows of >= ``n`` keys;
* ``margin_<x>``, ``decay_<x>``, ``early_<x>``: another ``MARGIN``, ``DECAY`` or
  ``EARLY`` (``early_inf``: the rule without early decisions);
* ``first_<n>``: the first decision after ``n`` windows;
* ``sig_<k>``: a switch at a window's end only on a lead of more than ``k`` standard
  deviations of the two shadows' decayed per-request hit differences; ``sigfree_<k>``:
  the same but for the first decision;
* ``window_<n>``: another ``WINDOW_MIN``;
* several at once, joined by ``+`` (``window_16384+early_3``).

Run from the repository root::

    PYTHONPATH=src nice python benchmarks/leader_variants.py rebuilt_r1 [CELLS_JSON]

``CELLS_JSON`` (default ``benchmarks/results/policy_cells.json``): the cell run to
compare with, e.g. one of other seeds (``policy_cells.py --seeds 4,5``).
"""

from __future__ import annotations

import json
import math
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
    elif variant.startswith("sig_"):
        _significant(float(variant.removeprefix("sig_")))
    elif variant.startswith("sigfree_"):  # no test at the first decision
        _significant(float(variant.removeprefix("sigfree_")), first=False)
    elif variant.startswith("sampled_"):
        sampling.FULL_SHADOWS_BELOW = 0
        sampling.SAMPLED_SHADOW_BLOCKS = int(variant.removeprefix("sampled_"))
    else:
        raise SystemExit(f"unknown variant {variant!r}")


def _significant(k: float, first: bool = True) -> None:
    """``sig_<k>``: at a window's end a challenger takes the lead only if its decayed
    score leads the leader's by more than ``k`` standard deviations: ``k`` times the
    square root of the sum, over the requests, of the squared per-request difference of
    the two shadows' hits, each weighted by the square of its window's decay weight
    (the scores' weights). Early decisions are unchanged. ``first`` false
    (``sigfree_<k>``): not at the first decision, which leaves ``START``, a leader no
    evidence chose."""
    from kvtier.scheduler.policies import leader

    observe, decide = leader.LeaderPolicy.observe, leader.LeaderPolicy._decide

    def fold(self: leader.LeaderPolicy) -> None:  # this request's squared differences
        gains = [s.hits - b for s, b in zip(self._shadows, self._before, strict=True)]
        window = self._pair_window
        for i, gi in enumerate(gains):
            for j, gj in enumerate(gains):
                window[i][j] += (gi - gj) ** 2
        self._before = [s.hits for s in self._shadows]

    def observed(self: leader.LeaderPolicy, keys):  # type: ignore[no-untyped-def]
        n = len(self._shadows)
        if not hasattr(self, "_pair_window"):
            self._pair_window = [[0] * n for _ in range(n)]
            self._pair_decayed = [[0.0] * n for _ in range(n)]
            self._before = [0] * n
        self._before = [s.hits for s in self._shadows]
        observe(self, keys)
        if any(s.hits for s in self._shadows):  # no decision in this request
            fold(self)

    def decided(self: leader.LeaderPolicy) -> None:
        fold(self)
        n = len(self._shadows)
        for i in range(n):
            for j in range(n):
                self._pair_decayed[i][j] = (
                    self._pair_decayed[i][j] * leader.DECAY**2 + self._pair_window[i][j]
                )
                self._pair_window[i][j] = 0
        lead = self._leader
        pairs = zip(self._scores, self._shadows, strict=True)
        scores = [score * leader.DECAY + shadow.hits for score, shadow in pairs]
        best = max(range(n), key=scores.__getitem__)
        noise = k * self._pair_decayed[best][lead] ** 0.5
        early = self._left > 0  # an early decision keeps its own test
        margin = leader.MARGIN
        tested = first or getattr(self, "_decisions", 0) > 0
        self._decisions = getattr(self, "_decisions", 0) + 1
        if tested and not early and scores[best] - scores[lead] <= noise:
            leader.MARGIN = math.inf  # within noise: the leader stays
        try:
            decide(self)
        finally:
            leader.MARGIN = margin
        self._before = [0] * n

    leader.LeaderPolicy.observe = observed  # type: ignore[method-assign]
    leader.LeaderPolicy._decide = decided  # type: ignore[method-assign]


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
    for workload, hits in results:
        ref = rows[workload]["hit_blocks"]
        best = [max(a, b) for a, b in zip(ref["lru"], ref["arc"], strict=True)]
        diffs = [h - b for h, b in zip(hits, best, strict=True)]
        in_step = [h - b for h, b in zip(hits, ref["leader"], strict=True)]
        for d in diffs:
            counts[0 if d > 0 else 1 if d == 0 else 2] += 1
        print(f"{workload:>16}: vs max(lru, arc) {diffs}  vs shipped leader {in_step}")
    load = os.getloadavg()
    print(
        f"{variant}: above {counts[0]}, equal {counts[1]}, below {counts[2]}; "
        f"{time.perf_counter() - start:.0f} s, load average {load[0]:.2f}"
    )


if __name__ == "__main__":
    main()
