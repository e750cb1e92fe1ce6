"""Screen ``branch`` (the shared-prefix LRU) and ``leader`` shadow sets on issue 14's cells.

Replays the real ``SharedPrefixPolicy`` (``src/kvtier/scheduler/policies/branch.py``)
with other constants, or ``leader`` with another set of shadows, through the real
manager (``kvtier.sim.replay``) on the workloads and capacities of ``policy_cells.py``,
and prints per workload the hit blocks minus max(lru, arc) and minus the ``leader``'s
(both read from the JSON, which must come from a cell run of the same lru/arc code).
Run from the repository root::

    PYTHONPATH=src nice python benchmarks/prefix_screen.py branch_0.5_3 [CELLS_JSON] \
        [--only=synthetic,chat_seed1] [--out=benchmarks/results/prefix-screen-....json]

``--cost``: instead, the paired per-block manager cost of the variant against ``lru``
(``manager_pair_ab.measure``: 200,000 blocks, none pinned, 8 rounds).

``CELLS_JSON`` (default ``benchmarks/results/policy_cells.json``): the cell run to
compare with, e.g. ``policy-cells-leader4-seeds45-20261124T0049Z.json`` for the
held-out seeds 4 and 5. Variants:

* ``branch_<share>_<kids>``: ``branch`` with ``SHARE`` and ``KIDS`` set (those left
  out keep their values); ``branch`` alone is the shipped one;
* ``lead_<a>.<b>...``: ``leader`` with these shadows (registered names or ``branch``),
  e.g. ``lead_lru.arc.branch`` (no SLRU).

The screens' prototypes (``branch_<f>_<k>`` with a fixed share, ``over_*``,
``abranch_*`` -- which became ``branch`` --, ``nbranch_*`` and ``observe_*``, all
learning without a bound) were dropped once ``branch`` was built, so that no second
copy of the policy lives here; ``docs/simulate.md`` records what they measured, and
commit ``7b14589``'s copy of this file has them.
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

from kvtier.bench.report import git_commit, machine_info
from kvtier.scheduler.policies import POLICIES, branch, leader
from kvtier.scheduler.policies.branch import SharedPrefixPolicy
from kvtier.sim.replay import replay

BRANCH_PARAMS = ("SHARE", "KIDS")
"""The ``branch`` module's constants a ``branch_<...>`` variant sets, in this order."""


def _register(variant: str) -> None:
    """Register ``variant`` in ``POLICIES`` (in the worker process: the constants it
    sets are module-wide)."""
    if variant.startswith("lead_"):
        names = variant.removeprefix("lead_").split(".")
        for name in names:
            if name not in POLICIES:
                _register(name)
        leader.CANDIDATES = tuple(POLICIES[name] for name in names)
        POLICIES[variant] = leader.LeaderPolicy
        return
    name, *params = variant.split("_")
    if name != "branch" or len(params) > len(BRANCH_PARAMS):
        raise SystemExit(f"unknown variant {variant!r}")
    for attr, param in zip(BRANCH_PARAMS, params, strict=False):
        setattr(branch, attr, type(getattr(branch, attr))(param))
    POLICIES[variant] = SharedPrefixPolicy


def _job(args: tuple[str, str]) -> tuple[str, list[int]]:
    workload, variant = args
    _register(variant)
    trace = pc._trace(workload)
    caps = [round(share * trace.num_distinct_blocks) for share in pc.SHARES]
    return workload, [replay(trace, cap, variant).ratios.hit_blocks for cap in caps]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    out = [Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--out=")]
    variant = args[0]
    if "--cost" in sys.argv:  # paired manager cost against lru (manager_pair_ab.py)
        import manager_pair_ab

        _register(variant)
        for op, r in manager_pair_ab.measure(variant, "lru", 200_000, 0, 8).items():
            assert isinstance(r, dict)
            print(
                f"{op:<12} {variant} {r[variant]:7.0f}  lru {r['lru']:7.0f} ns/block CPU, "
                f"paired ratio {r['ratio']:.2f}"
            )
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    cells = args[1] if len(args) > 1 else "benchmarks/results/policy_cells.json"
    doc = json.loads(Path(cells).read_text())
    rows = {row["workload"]: row for row in doc["rows"]}
    names = [w for w in rows if not only or w in only[0]]
    start = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(_job, [(w, variant) for w in names]))
    counts = [0, 0, 0]
    lead = [0, 0, 0]
    for workload, hits in results:
        ref = rows[workload]["hit_blocks"]
        best = [max(a, b) for a, b in zip(ref["lru"], ref["arc"], strict=True)]
        diffs = [h - b for h, b in zip(hits, best, strict=True)]
        for d in diffs:
            counts[0 if d > 0 else 1 if d == 0 else 2] += 1
        line = f"{workload:>16}: vs max(lru, arc) {diffs}"
        if "leader" in ref:
            vs = [h - b for h, b in zip(hits, ref["leader"], strict=True)]
            line += f"  vs leader {vs}"
            for d in vs:
                lead[0 if d > 0 else 1 if d == 0 else 2] += 1
        print(line, flush=True)
    load = os.getloadavg()
    print(
        f"{variant}: above {counts[0]}, equal {counts[1]}, below {counts[2]} "
        f"(vs leader {lead[0]}/{lead[1]}/{lead[2]}); "
        f"{time.perf_counter() - start:.0f} s, load average {load[0]:.2f}"
    )
    if out:
        doc = {
            "benchmark": "prefix_screen",
            "machine": machine_info(),
            "commit": git_commit(),
            "load_average": load,
            "configuration": {"variant": variant, "cells": cells, "shares": pc.SHARES},
            "hit_blocks": dict(results),
            "summary": {"above": counts[0], "equal": counts[1], "below": counts[2]},
        }
        out[0].write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
