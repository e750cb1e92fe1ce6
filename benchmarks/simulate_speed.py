"""Replay speed of ``kvtier simulate``: block accesses per second, one core.

Seeded (the trace is fixed), one warm-up replay, then best and median of ``--repeat``
replays per policy (``--policy``, repeatable; default lru, arc, slru and the engine's
default) and capacity (wall time of the replay loop), and the best per CPU-second of
the process (robust on a shared machine), side by side, with each policy's CPU time
over LRU's; one summary line; JSON with the machine, commit and configuration. Run
from the repository root::

    PYTHONPATH=src nice python benchmarks/simulate_speed.py \
        --out benchmarks/results/simulate_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from kvtier.bench.report import git_commit, machine_info
from kvtier.config import DEFAULT_EVICTION_POLICY
from kvtier.sim.cli import DEFAULT_TRACE
from kvtier.sim.replay import replay
from kvtier.sim.trace import read_mooncake


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", action="append", help="repeatable (default: lru, arc, ...)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trace = read_mooncake(args.trace)
    shares = (0.01, 0.05, 0.10, 0.25, 0.50)
    policies = tuple(args.policy or dict.fromkeys(("lru", "arc", "slru", DEFAULT_EVICTION_POLICY)))
    replay(trace, round(0.05 * trace.num_distinct_blocks), "lru")  # warm-up
    rows = []
    for policy in policies:
        for share in shares:
            blocks = round(share * trace.num_distinct_blocks)
            speeds, cpu_speeds = [], []
            for _ in range(args.repeat):
                cpu = time.process_time()
                result = replay(trace, blocks, policy)
                cpu = time.process_time() - cpu  # includes building the manager
                speeds.append(result.accesses_per_second)
                cpu_speeds.append(trace.num_block_refs / cpu)
            rows.append(
                {
                    "policy": policy,
                    "capacity": f"{share:.0%}",
                    "capacity_blocks": blocks,
                    "best_accesses_per_second": max(speeds),
                    "median_accesses_per_second": statistics.median(speeds),
                    "best_accesses_per_cpu_second": max(cpu_speeds),
                }
            )
    lru_cpu = {
        r["capacity"]: r["best_accesses_per_cpu_second"] for r in rows if r["policy"] == "lru"
    }
    for r in rows:  # CPU time per access over LRU's, at the same capacity
        if r["capacity"] in lru_cpu:
            r["cpu_time_vs_lru"] = lru_cpu[r["capacity"]] / r["best_accesses_per_cpu_second"]
    lru = [r["best_accesses_per_second"] for r in rows if r["policy"] == "lru"]
    print(
        f"simulate speed: LRU {min(lru):,.0f}-{max(lru):,.0f} block accesses/s (best of "
        f"{args.repeat}, {trace.num_block_refs} accesses, capacities 1-50 %)"
    )
    for r in rows:
        print(
            f"  {r['policy']:<5} {r['capacity']:>4} best {r['best_accesses_per_second']:>9,.0f}"
            f"  median {r['median_accesses_per_second']:>9,.0f}"
            f"  per CPU-second {r['best_accesses_per_cpu_second']:>9,.0f}"
            + (f"  ({r['cpu_time_vs_lru']:.1f}x LRU's CPU)" if "cpu_time_vs_lru" in r else "")
        )
    if args.out:
        doc = {
            "benchmark": "simulate_speed",
            "trace": str(args.trace),
            "block_refs": trace.num_block_refs,
            "config": {"repeat": args.repeat, "policies": policies, "shares": shares},
            "machine": {**machine_info(), "load_average": os.getloadavg()},
            "commit": git_commit(),
            "results": rows,
        }
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
