"""The compiled row copier built with different streaming interleaves, side by side.

Run from the repository root: ``PYTHONPATH=src python benchmarks/hostcopy_interleave_ab.py
[repeats] [out.json]``. Builds ``src/kvtier/worker/rowcopy.c`` with ``-DWAYS=W -DSTEP=S``
for each variant (``WAYS=1``: one fragment after the other, the loop before the
interleave), then times ONE streaming call per job (a store: 4 separate fragment
tensors -> the slab's rows; a load: the reverse), random rows, in thread CPU time,
with 64 MiB written before each call (cold caches); the variants alternate, their
order reversing every repeat. Prints and writes medians per case, variant and
direction, with the load averages before and after.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kvtier.bench.report import git_commit, machine_info
from kvtier.worker import rowcopy
from kvtier.worker.pagecopy import slab_fragments

VARIANTS = {"ways1": (1, 256), "ways4": (4, 256), "ways8": (8, 256)}
CASES = ((8192, 4, 4096), (8192, 8, 2048), (16384, 4, 256), (65536, 4, 256), (262144, 4, 16))
"""(fragment bytes, fragments, rows per job)."""


def build(tmp: Path, ways: int, step: int) -> rowcopy.NativeRowCopier:
    out = tmp / f"rowcopy-w{ways}-s{step}.so"
    cmd = ["cc", *rowcopy.CFLAGS, f"-DWAYS={ways}", f"-DSTEP={step}", "-o", str(out)]
    subprocess.run([*cmd, str(rowcopy.SOURCE)], check=True)
    return rowcopy.NativeRowCopier(ctypes.CDLL(str(out)), out)


def one_case(copiers, page: int, frags_n: int, blocks: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    frags = [
        torch.randint(0, 256, (2 * blocks, page), dtype=torch.uint8, generator=gen)
        for _ in range(frags_n)
    ]
    slab = torch.ones((2 * blocks, frags_n * page), dtype=torch.uint8)
    cpu = slab_fragments(slab, [page] * frags_n)
    g = torch.randperm(2 * blocks, generator=gen).numpy()[:blocks].astype(np.int64)
    c = torch.randperm(2 * blocks, generator=gen).numpy()[:blocks].astype(np.int64)
    routes = {k: (cp.route(frags, cpu), cp.route(cpu, frags)) for k, cp in copiers.items()}
    evict = torch.empty(64 << 20, dtype=torch.uint8)
    times: dict[str, list[float]] = {f"{k} {d}": [] for k in copiers for d in ("store", "load")}
    names = list(copiers)
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            for d, (rt, a, b) in (("store", (routes[k][0], g, c)), ("load", (routes[k][1], c, g))):
                evict.fill_(r & 255)
                start = time.thread_time()
                rt.copy(a, b, True)
                times[f"{k} {d}"].append(time.thread_time() - start)
    return {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-interleave-ab.json"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        copiers = {k: build(Path(tmp), w, s) for k, (w, s) in VARIANTS.items()}
        rows = []
        for page, frags_n, blocks in CASES:
            ms = one_case(copiers, page, frags_n, blocks, repeats)
            rows.append({"page_bytes": page, "fragments": frags_n, "blocks": blocks, "ms": ms})
            print(f"{page // 1024} KiB x {frags_n} frags x {blocks}: {ms}", flush=True)
    result = {
        "benchmark": "hostcopy_interleave_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "variants": {k: {"ways": w, "step": s} for k, (w, s) in VARIANTS.items()},
            "repeats": repeats,
            "clock": "thread CPU time of the C call",
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
