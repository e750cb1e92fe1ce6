"""A/B of ``kvtier bench manager`` between two source trees, for a loaded machine.

Runs the bench for each policy with each tree in turn, ``--runs`` times alternating
(A, B, A, B, ...), so both trees see the same spread of load; each run is a separate
process. Reported per policy, pin count and operation: the median over the runs of
each run's own median CPU ns per block, and the median of the per-run ratios B / A.
The load average is recorded with every run. From the repository root::

    nice python benchmarks/manager_tree_ab.py --a base=/tmp/base/src --b now=src \
        --policy arc --policy slru --runs 5 \
        --out benchmarks/results/manager-tree-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvtier.bench.report import machine_info

OPS = ("lookup", "touch", "load", "store_evict")


def bench(src: str, policy: str) -> dict[str, Any]:
    """One ``kvtier bench manager`` run of one policy with ``src`` on the path."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, PYTHONPATH=src)
        cmd = [sys.executable, "-m", "kvtier", "bench", "manager", "--policy", policy]
        subprocess.run([*cmd, "--json", str(out)], env=env, check=True, capture_output=True)
        doc = json.loads(out.read_text())
    results: dict[str, Any] = doc["results"][policy]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="NAME=SRC_DIR (the base)")
    parser.add_argument("--b", required=True, help="NAME=SRC_DIR (the change)")
    parser.add_argument("--policy", action="append", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    (a, a_src), (b, b_src) = (s.split("=", 1) for s in (args.a, args.b))
    sides = {a: str(Path(a_src).resolve()), b: str(Path(b_src).resolve())}
    runs: list[dict[str, Any]] = []
    for r in range(args.runs):
        for policy in args.policy:
            for name, src in sides.items():
                load = os.getloadavg()[0]
                result = bench(src, policy)
                runs.append(
                    {
                        "run": r,
                        "policy": policy,
                        "side": name,
                        "load_1min": load,
                        "cpu_ns": {p: m["cpu"] for p, m in result.items()},
                    }
                )
                print(
                    f"run {r} {policy:<8} {name:<6} load {load:.2f} store+evict "
                    + " / ".join(f"{m['cpu']['store_evict']:.0f}" for m in result.values()),
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for policy in args.policy:
        mine = [x for x in runs if x["policy"] == policy]
        for pin in mine[0]["cpu_ns"]:
            for op in OPS:
                va = [x["cpu_ns"][pin][op] for x in mine if x["side"] == a]
                vb = [x["cpu_ns"][pin][op] for x in mine if x["side"] == b]
                summary.setdefault(policy, {}).setdefault(pin, {})[op] = {
                    a: round(statistics.median(va)),
                    b: round(statistics.median(vb)),
                    "ratio": round(
                        statistics.median(y / x for x, y in zip(va, vb, strict=True)), 3
                    ),
                }
                row = summary[policy][pin][op]
                print(
                    f"{policy:<8} pinned {pin:>6} {op:<12} {a} {row[a]:>6}  {b} {row[b]:>6}"
                    f"  ratio {row['ratio']:.3f}"
                )
    loads = [x["load_1min"] for x in runs]
    print(
        f"load average (1 min) over the runs: {min(loads):.2f}-{max(loads):.2f}, "
        f"median {statistics.median(loads):.2f}"
    )
    if args.out:
        doc = {
            "benchmark": "manager_tree_ab",
            "command": " ".join(sys.argv),
            "sides": sides,
            "commit": subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "machine": machine_info(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1min": {
                "min": min(loads),
                "max": max(loads),
                "median": statistics.median(loads),
            },
            "median_cpu_ns_per_block": summary,
            "runs": runs,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
