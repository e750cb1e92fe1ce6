"""The host page copier's two paths side by side in one run: compiled rows vs numpy.

Run from the repository root: ``PYTHONPATH=src python benchmarks/hostcopy_ab.py
[repeats] [out.json] [warm|cold]``. Both are ``HostPageCopier`` over the same fragments, slab and
plan: "native" with the compiled row copier (``worker/rowcopy.c``, one call per job),
"numpy" with ``KVTIER_NATIVE_COPY=0`` (the fallback: chunked fancy indexing, or one
``np.copyto`` per row from 32 KiB). Before timing, both are checked to leave exactly
the same bytes as a reference built by per-row torch slicing.

Each candidate is timed in CPU time of the calling thread (``time.thread_time``; a
loaded machine disturbs it less than wall time) and in wall time, one thread (torch
set to one), median of ``repeats`` round-robin passes. Reported as GB/s and as the
ratio to ``plain1``, one contiguous torch ``copy_`` of the job's bytes on one thread
(higher is better). 2 layers (4 fragments), GPU ids random, host ids random or
contiguous. ``cold`` (the default) writes a 96 MiB buffer before each timed call (not
timed), so every candidate starts from the same cache state, as a job's rows mostly
are in a serving engine; ``warm`` times back to back, which lets each candidate
inherit what the previous one left in the cache (a store's non-temporal writes leave
the rows a following load reads in memory, ordinary ones leave them in the cache).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from kvtier.bench.report import git_commit, machine_info
from kvtier.worker.blockmap import RowPlan
from kvtier.worker.pagecopy import HostPageCopier, slab_fragments
from kvtier.worker.rowcopy import SWITCH_ENV

LAYERS = 2
CASES = (
    (8192, 16),
    (8192, 256),
    (8192, 4096),
    (16384, 16),
    (16384, 256),
    (16384, 4096),
    (65536, 16),
    (65536, 256),
    (262144, 16),
    (262144, 256),
)


def copier(frags: list[torch.Tensor], slab: torch.Tensor, native: bool) -> HostPageCopier:
    old = os.environ.get(SWITCH_ENV)
    os.environ[SWITCH_ENV] = "1" if native else "0"
    try:
        made = HostPageCopier(frags, slab)
    finally:
        if old is None:
            del os.environ[SWITCH_ENV]
        else:
            os.environ[SWITCH_ENV] = old
    assert made.kind == ("native" if native else "numpy"), made.kind
    return made


def check_bytes(
    copiers: dict[str, HostPageCopier], plan: RowPlan, frags: list[torch.Tensor], slab: torch.Tensor
) -> None:
    """Every copier's store and load leave the bytes of a per-row torch reference."""
    slab0, frags0 = slab.clone(), [f.clone() for f in frags]
    cols = slab_fragments(slab, [int(f.shape[1]) for f in frags])
    rows = list(zip(plan.gpu_rows.tolist(), plan.cpu_rows.tolist(), strict=True))
    want_slab = slab0.clone()
    want_cols = slab_fragments(want_slab, [int(f.shape[1]) for f in frags])
    for g, c in rows:
        for f, col in zip(frags0, want_cols, strict=True):
            col[c] = f[g]
    for name, cp in copiers.items():
        slab.copy_(slab0)
        cp.copy(plan, True)
        assert torch.equal(slab, want_slab), f"{name} store differs"
        for f in frags:
            f.zero_()
        cp.copy(plan, False)
        for f, col in zip(frags, cols, strict=True):
            for g, c in rows:
                assert torch.equal(f[g], col[c]), f"{name} load differs"
        for f, f0 in zip(frags, frags0, strict=True):
            f.copy_(f0)
    slab.copy_(slab0)


FLUSH = torch.zeros(96 << 20, dtype=torch.uint8)


def one_case(page: int, blocks: int, ids: str, repeats: int, cold: bool) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    size = page * 2 * LAYERS
    frags = [
        torch.randint(0, 256, (2 * blocks, page), dtype=torch.uint8, generator=gen)
        for _ in range(2 * LAYERS)
    ]
    slab = torch.randint(0, 256, (2 * blocks, size), dtype=torch.uint8, generator=gen)
    gpu = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    cpu = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    if ids == "contiguous":
        cpu = np.arange(blocks, dtype=np.int64)
    plan = RowPlan.pairing(gpu, cpu)
    copiers = {"native": copier(frags, slab, True), "numpy": copier(frags, slab, False)}
    check_bytes(copiers, plan, frags, slab)
    src = torch.ones(blocks * size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    fns: dict[str, Callable[[], object]] = {"plain1": lambda: dst.copy_(src)}
    for name, cp in copiers.items():
        fns[f"{name}_g2c"] = lambda cp=cp: cp.copy(plan, True)
        fns[f"{name}_c2g"] = lambda cp=cp: cp.copy(plan, False)
    for fn in fns.values():
        fn()
    cpu_t: dict[str, list[float]] = {k: [] for k in fns}
    wall_t: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if cold:
                FLUSH.add_(1)
            c0, w0 = time.thread_time(), time.perf_counter()
            fn()
            cpu_t[name].append(time.thread_time() - c0)
            wall_t[name].append(time.perf_counter() - w0)
    nbytes = blocks * size
    row: dict[str, object] = {"page_bytes": page, "blocks": blocks, "ids": ids}
    for clock, times in (("cpu", cpu_t), ("wall", wall_t)):
        med = {k: max(statistics.median(v), 1e-9) for k, v in times.items()}
        row[f"{clock}_gbps"] = {k: round(nbytes / v / 1e9, 2) for k, v in med.items()}
        row[f"{clock}_ratio"] = {
            k: round(med["plain1"] / v, 3) for k, v in med.items() if k != "plain1"
        }
    return row


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-ab.json"
    cold = (sys.argv[3] if len(sys.argv) > 3 else "cold") == "cold"
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    rows = []
    for page, blocks in CASES:
        for ids in ("random", "contiguous"):
            rows.append(one_case(page, blocks, ids, repeats, cold))
            r = rows[-1]
            print(
                f"{page // 1024:>4} KiB x {blocks:>4} {ids:<10} cpu GB/s {r['cpu_gbps']}",
                flush=True,
            )
    result = {
        "benchmark": "hostcopy_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "layers": LAYERS,
            "repeats": repeats,
            "threads": 1,
            "caches": "cold" if cold else "warm",
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
