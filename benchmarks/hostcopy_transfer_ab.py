"""Whole handler jobs with the compiled row copier and with its numpy fallback, alternated.

Run from the repository root: ``PYTHONPATH=src python benchmarks/hostcopy_transfer_ab.py
[rounds] [out.json]``. Each round runs ``kvtier bench transfer``'s grid (CPU; pages
8, 16, 64, 256 KiB; 16, 256, 4096 blocks; random and contiguous host ids; 5 repeats)
twice in this process: once with the native copier, once with ``KVTIER_NATIVE_COPY=0``
(the order swaps every round). Reported per case: the median over rounds of each
run's wall GB/s of ``g2c`` / ``c2g`` / ``both`` and of its ``ratio_plain1`` (against
the one-thread plain copy timed in the same run), native and numpy side by side, and
the ratio native / numpy. Load averages before and after are recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

from kvtier.bench.report import git_commit, machine_info
from kvtier.bench.transfer import run_transfer_bench
from kvtier.worker.rowcopy import SWITCH_ENV

KiB = 1024
PAGES = (8 * KiB, 16 * KiB, 64 * KiB, 256 * KiB)
BLOCKS = (16, 256, 4096)
JOBS = ("g2c", "c2g", "both")


def one_run(native: bool) -> dict[tuple[int, int, str], dict[str, Any]]:
    os.environ[SWITCH_ENV] = "1" if native else "0"
    res = run_transfer_bench(PAGES, BLOCKS, ids=("random", "contiguous"), repeats=5, device="cpu")
    assert res["config"]["host_copier"] == ("native" if native else "numpy")
    return {(c["page_bytes"], c["blocks"], c["ids"]): c for c in res["cases"]}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-transfer-ab.json"
    load_before = os.getloadavg()
    runs: dict[str, list[dict[tuple[int, int, str], dict[str, Any]]]] = {
        "native": [],
        "numpy": [],
    }
    for r in range(rounds):
        order = ("native", "numpy") if r % 2 == 0 else ("numpy", "native")
        for name in order:
            runs[name].append(one_run(name == "native"))
            print(f"round {r + 1}/{rounds} {name} done, load {os.getloadavg()}", flush=True)
    rows = []
    for key in runs["native"][0]:
        row: dict[str, Any] = {"page_bytes": key[0], "blocks": key[1], "ids": key[2]}
        for name, rs in runs.items():
            row[f"{name}_gbps"] = {
                k: round(statistics.median(run[key]["gbps"][k] for run in rs), 3)
                for k in ("plain1", *JOBS)
            }
            row[f"{name}_ratio_plain1"] = {
                k: round(statistics.median(run[key]["ratio_plain1"][k] for run in rs), 3)
                for k in JOBS
            }
        row["native_over_numpy"] = {
            k: round(row["native_gbps"][k] / row["numpy_gbps"][k], 3) for k in JOBS
        }
        rows.append(row)
        print(
            f"{key[0] // KiB:>4} KiB x {key[1]:>4} {key[2]:<10} vs plain1 native "
            f"{row['native_ratio_plain1']} numpy {row['numpy_ratio_plain1']} "
            f"native/numpy {row['native_over_numpy']}",
            flush=True,
        )
    result = {
        "benchmark": "hostcopy_transfer_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "rounds": rounds,
            "pages": list(PAGES),
            "blocks": list(BLOCKS),
            "repeats": 5,
            "layers": 2,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
