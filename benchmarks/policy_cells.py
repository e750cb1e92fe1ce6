"""The trace-replay cells: a policy's block hit ratio against max(LRU, ARC), every cell.

Replays the 13 replayable workloads -- the shipped synthetic trace and ``--generate``
seeds 1, 2, 3 of the shapes mixed, chat, documents and agents -- at 1, 5, 10, 25 and
50 % of each one's distinct blocks, through the real manager (``kvtier.sim.replay``),
for ``lru``, ``arc`` and the candidate policies (default: the engine's default,
``OffloadingConfig.eviction_policy``), and prints one row per workload: the candidate's
hit blocks minus max(LRU, ARC)'s, per capacity (>= 0 wins the cell). Hit blocks are
exact integers, so a tie is a tie. Run from the repository root::

    PYTHONPATH=src nice python benchmarks/policy_cells.py --jobs 2 \
        --out benchmarks/results/policy_cells.json

``--quick`` replays only seed 1 of each generated shape plus the synthetic trace;
``--seeds 4,5`` other seeds of the generated shapes (held out from the tuning; the
synthetic trace only with seed 1). ``--scale 10`` generates each shape 10 times as
large (requests, open conversations and agents, system and tool prompts; no synthetic
trace): its 25 and 50 % tiers reach 65,536 blocks, where ``leader`` samples.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from kvtier.bench.report import git_commit, machine_info
from kvtier.config import DEFAULT_EVICTION_POLICY
from kvtier.sim.cli import DEFAULT_TRACE
from kvtier.sim.replay import replay
from kvtier.sim.trace import Trace, read_mooncake
from kvtier.sim.workload import WorkloadConfig, generate, shaped

SHARES = (0.01, 0.05, 0.10, 0.25, 0.50)
SHAPES = ("mixed", "chat", "documents", "agents")


def _workloads(seeds: tuple[int, ...], scale: int = 1) -> list[str]:
    synthetic = ["synthetic"] if 1 in seeds and scale == 1 else []
    return synthetic + [f"{shape}_seed{seed}" for shape in SHAPES for seed in seeds]


def _scaled(config: WorkloadConfig, scale: int) -> WorkloadConfig:
    """The same shape ``scale`` times as large: as many more requests, and as many more
    of everything they share or keep open."""
    return replace(
        config,
        requests=config.requests * scale,
        open_chats=config.open_chats * scale,
        system_prompts=config.system_prompts * scale,
        open_agents=config.open_agents * scale,
        tool_prompts=config.tool_prompts * scale,
    )


def _trace(workload: str, scale: int = 1) -> Trace:
    if workload == "synthetic":
        return read_mooncake(DEFAULT_TRACE)
    shape, seed = workload.split("_seed")
    return generate(_scaled(shaped(shape, int(seed)), scale))


def _run(job: tuple[str, tuple[str, ...], int]) -> dict[str, object]:
    workload, policies, scale = job
    trace = _trace(workload, scale)
    hits: dict[str, list[int]] = {}
    caps = [round(share * trace.num_distinct_blocks) for share in SHARES]
    for policy in policies:
        hits[policy] = [replay(trace, cap, policy).ratios.hit_blocks for cap in caps]
    refs = sum(len(r.keys) for r in trace.requests)
    return {"workload": workload, "capacities": caps, "block_refs": refs, "hit_blocks": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policy", action="append", help=f"candidate (default: {DEFAULT_EVICTION_POLICY})"
    )
    parser.add_argument("--quick", action="store_true", help="seed 1 only (5 workloads)")
    parser.add_argument("--seeds", default="1,2,3", help="generated seeds (default 1,2,3)")
    parser.add_argument("--scale", type=int, default=1, help="generated shapes x N (default 1)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    candidates = tuple(args.policy or [DEFAULT_EVICTION_POLICY])
    policies = ("lru", "arc", *candidates)
    start = time.perf_counter()
    seeds = (1,) if args.quick else tuple(int(seed) for seed in args.seeds.split(","))
    jobs = [(w, policies, args.scale) for w in _workloads(seeds, args.scale)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, jobs))
    print(
        "cells: candidate hit blocks minus max(lru, arc) at 1/5/10/25/50 %; "
        "(pts) = block hit ratio points"
    )
    summary = {}
    for cand in candidates:
        wins = ties = losses = 0
        print(f"== {cand}")
        for row in rows:
            hits = row["hit_blocks"]
            refs = row["block_refs"]
            cells = []
            for i in range(len(SHARES)):
                best = max(hits["lru"][i], hits["arc"][i])
                diff = hits[cand][i] - best
                wins += diff > 0
                ties += diff == 0
                losses += diff < 0
                mark = "" if diff >= 0 else " X"
                cells.append(f"{diff:+6d} ({100 * diff / refs:+.2f}){mark}")
            print(f"{row['workload']:>16}: " + " | ".join(cells))
        summary[cand] = {"above": wins, "equal": ties, "below": losses}
        print(f"{cand}: above {wins}, equal {ties}, below {losses} of {wins + ties + losses}")
    load = os.getloadavg()
    print(f"{time.perf_counter() - start:.0f} s, load average {load[0]:.2f} {load[1]:.2f}")
    if args.out:
        doc = {
            "benchmark": "policy_cells",
            "machine": machine_info(),
            "commit": git_commit(),
            "load_average": load,
            "configuration": {
                "shares": SHARES,
                "policies": policies,
                "seeds": seeds,
                "scale": args.scale,
            },
            "rows": rows,
            "summary": summary,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
