"""Print the ``docs/simulate.md`` tables of the ``kvtier simulate`` sweep files.

Reads ``benchmarks/results/simulate_<workload>.json`` (one sweep per workload, made by
the commands in ``docs/simulate.md``, "Every workload") and prints, per workload, the
markdown table of block hit ratios: one row per policy, then Belady's. The rows of the
policies named by ``--mark`` (default ``adaptive``, ``leader``, ``density``) are bold
where they are at least max(lru, arc) in that cell and marked ✗ where below it, by
exact hit blocks. Run from the repository root::

    python benchmarks/simulate_tables.py [WORKLOAD ...] [--mark leader --mark density]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path("benchmarks/results")
WORKLOADS = ["synthetic"] + [
    f"{shape}_seed{seed}"
    for shape in ("mixed", "chat", "documents", "agents")
    for seed in (1, 2, 3)
]


def _title(workload: str, trace: dict[str, int]) -> str:
    name = workload.replace("_seed", ", seed ")
    return (
        f"**{name}** ({trace['requests']:,} requests, {trace['block_refs']:,} block "
        f"references, {trace['distinct_blocks']:,} distinct blocks); block hit ratio (%):"
    )


def table(workload: str, marked: list[str]) -> str:
    """The markdown title, table and plot link of one workload's sweep file."""
    doc = json.loads((RESULTS / f"simulate_{workload}.json").read_text())
    points = doc["results"]["points"]
    policies = doc["config"]["policies"]
    heads = [f"{p['capacity']} ({p['capacity_blocks']:,})" for p in points]
    lines = [
        _title(workload, doc["config"]["trace"]),
        "",
        "| policy | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 1) + "|",
    ]
    runs = [{run["policy"]: run for run in point["runs"]} for point in points]
    for policy in policies:
        cells = []
        for by_policy in runs:
            run = by_policy[policy]
            text = f"{100 * run['block_hit_ratio']:.2f}"
            if policy in marked:
                best = max(by_policy["lru"]["hit_blocks"], by_policy["arc"]["hit_blocks"])
                text = f"**{text}**" if run["hit_blocks"] >= best else f"{text} ✗"
            cells.append(text)
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    belady = [f"{100 * p['belady_block_hit_ratio']:.2f}" for p in points]
    lines.append("| Belady (offline) | " + " | ".join(belady) + " |")
    lines += ["", f"![{workload}](../benchmarks/results/simulate_{workload}.png)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=WORKLOADS)
    parser.add_argument("--mark", action="append")
    args = parser.parse_args()
    marked = args.mark or ["adaptive", "leader", "density"]
    print("\n\n".join(table(workload, marked) for workload in args.workloads))


if __name__ == "__main__":
    main()
