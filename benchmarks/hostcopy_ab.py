"""Old and new host page copier side by side in one run (CPU stand-in of GPU<->CPU).

Run from the repository root: ``PYTHONPATH=src python benchmarks/hostcopy_ab.py
[repeats] [out.json]``. "old" is ``HostPageCopier`` as of commit 1dbccb5 (scattered
rows through two staging buffers laid out like the slab, gather and scatter overlapped
on a helper thread), loaded from git; "new" is the working tree's (scattered rows
moved straight between fragment and slab, per fragment and ~256 KiB chunk, by numpy;
fragments of 32 KiB and more one ``np.copyto`` per row since 2026-11-23 18:00 UTC).
"memmove" is a third candidate: one ``ctypes.memmove`` per fragment row, addresses
computed before timing, first checked to leave exactly the bytes the copier leaves.
Each value is a plain torch
``copy_`` of the job's bytes divided by the copier's time for the job (higher is
better), median of ``repeats`` round-robin passes; 2 layers (4 fragments), GPU ids
random.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from kvtier.bench.report import git_commit, machine_info
from kvtier.worker import pagecopy as new
from kvtier.worker.blockmap import RowPlan

OLD_COMMIT = "1dbccb5"


def old_module() -> object:
    src = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:src/kvtier/worker/pagecopy.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("old_pagecopy", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_pagecopy"] = module  # its dataclasses look their module up
    exec(compile(src, "old_pagecopy", "exec"), module.__dict__)
    return module


def one_pass_memmove(
    frags: list[torch.Tensor], slab: torch.Tensor, plan: RowPlan
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Store and load with one ``memmove`` per fragment row (addresses precomputed)."""
    page, size, base = int(frags[0].shape[1]), int(slab.shape[1]), slab.data_ptr()
    rows = zip(plan.gpu_rows.tolist(), plan.cpu_rows.tolist(), strict=True)
    pairs = [
        (base + c * size + i * page, f.data_ptr() + g * page)
        for g, c in rows
        for i, f in enumerate(frags)
    ]
    move = ctypes.memmove

    def store() -> None:
        for dst, src in pairs:
            move(dst, src, page)

    def load() -> None:
        for dst, src in pairs:
            move(src, dst, page)

    return store, load


def check_same_bytes(
    copier: object,
    plan: RowPlan,
    frags: list[torch.Tensor],
    slab: torch.Tensor,
    candidates: dict[str, tuple[Callable[[], None], Callable[[], None]]],
) -> None:
    """Each candidate leaves the slab (store) and the fragments (load) exactly as the
    copier does; the slab and fragments are restored afterwards."""
    slab0, frags0 = slab.clone(), [f.clone() for f in frags]
    copier.copy(plan, True)  # type: ignore[attr-defined]
    want_slab = slab.clone()
    copier.copy(plan, False)  # type: ignore[attr-defined]
    want_frags = [f.clone() for f in frags]
    for name, (store, load) in candidates.items():
        slab.copy_(slab0)
        store()
        assert torch.equal(slab, want_slab), f"{name} store differs"
        for f, f0 in zip(frags, frags0, strict=True):
            f.copy_(f0)
        load()
        assert all(torch.equal(f, w) for f, w in zip(frags, want_frags, strict=True)), name
    slab.copy_(slab0)
    for f, f0 in zip(frags, frags0, strict=True):
        f.copy_(f0)


def one_case(old: object, page: int, blocks: int, ids: str, repeats: int) -> dict[str, object]:
    layers, gen = 2, torch.Generator().manual_seed(0)
    size = page * 2 * layers
    frags = [
        torch.randint(0, 256, (2 * blocks, page), dtype=torch.uint8, generator=gen)
        for _ in range(2 * layers)
    ]
    slab = torch.ones((2 * blocks, size), dtype=torch.uint8)
    gpu = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    cpu = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    if ids == "contiguous":
        cpu = np.arange(blocks, dtype=np.int64)
    plan = RowPlan.pairing(gpu, cpu)
    a = old.HostPageCopier(frags, slab)  # type: ignore[attr-defined]
    b = new.HostPageCopier(frags, slab)
    mm_g2c, mm_c2g = one_pass_memmove(frags, slab, plan)
    check_same_bytes(b, plan, frags, slab, {"memmove": (mm_g2c, mm_c2g)})
    src = torch.ones(blocks * size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    fns: dict[str, Callable[[], object]] = {
        "plain": lambda: dst.copy_(src),
        "old_g2c": lambda: a.copy(plan, True),
        "new_g2c": lambda: b.copy(plan, True),
        "old_c2g": lambda: a.copy(plan, False),
        "new_c2g": lambda: b.copy(plan, False),
        "memmove_g2c": mm_g2c,
        "memmove_c2g": mm_c2g,
    }
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    b.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: round(med["plain"] / v, 3) for k, v in med.items() if k != "plain"}
    plain = round(blocks * size / med["plain"] / 1e9, 2)
    return {"page_bytes": page, "blocks": blocks, "ids": ids, "plain_gbps": plain, **ratios}


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-ab.json"
    old = old_module()
    rows = []
    for page in (8192, 16384, 65536):
        for blocks in (256, 4096):
            if blocks * page * 4 > (128 << 20):
                continue
            for ids in ("random", "contiguous"):
                rows.append(one_case(old, page, blocks, ids, repeats))
                print(rows[-1], flush=True)
    result = {
        "benchmark": "hostcopy_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {"old_commit": OLD_COMMIT, "layers": 2, "repeats": repeats},
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
