"""The floor of host copies of scattered rows on this machine: every primitive at hand.

Run from the repository root: ``PYTHONPATH=src python benchmarks/hostcopy_floor.py
[out.json]``. One thread (torch set to one), process CPU time of each candidate
(a loaded machine disturbs it less than wall time), median of round-robin passes,
4 fragments of ``page`` bytes per block, random source and destination rows, as GB/s
of the job's bytes:

* ``plain1`` / ``np_copyto``: one contiguous copy of the same bytes (torch, numpy);
* ``rows_in_order``: the handler's chunked numpy statements over rows 0..n-1 on both
  sides (the primitive's own cost, without the scatter);
* ``scattered``: the same statements over the random rows (the handler's copy for
  fragments under 32 KiB);
* ``by_row``: one ``np.copyto`` per fragment row (the handler's copy from 32 KiB);
* ``gather_take`` / ``gather_getitem``: the bare gather of the random source rows into
  one contiguous buffer (``np.take(mode="clip")`` straight in; a numpy fancy index
  then a slice assignment): reading the same scattered rows, writing nothing
  scattered;
* ``memmove_rows``: one ``ctypes.memmove`` per fragment row, addresses precomputed;
* ``native_memmove`` / ``native_stream``: the compiled row copier
  (``kvtier.worker.rowcopy``), one call for the whole job, scattered rows straight to
  scattered rows, one ``memmove`` per fragment row / non-temporal stores (it streams
  jobs of ``STREAM_MIN_BYTES`` and more). Absent when it cannot be built.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from kvtier.bench.report import git_commit, machine_info
from kvtier.worker.pagecopy import row_items
from kvtier.worker.rowcopy import native_row_copier

FRAGMENTS = 4
CHUNK = 256 * 1024
CASES = ((8192, 256), (8192, 4096), (16384, 256), (65536, 256), (262144, 128))


def case(page: int, blocks: int, repeats: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    frags = [
        torch.randint(0, 256, (2 * blocks, page), dtype=torch.uint8, generator=gen)
        for _ in range(FRAGMENTS)
    ]
    slab = torch.ones((2 * blocks, page * FRAGMENTS), dtype=torch.uint8)
    g = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    c = torch.randperm(2 * blocks, generator=gen)[:blocks].numpy().astype(np.int64)
    src_rows = [row_items(f) for f in frags]
    slab_cols = [slab[:, i * page : (i + 1) * page] for i in range(FRAGMENTS)]
    dst_rows = [row_items(col) for col in slab_cols]
    out = torch.empty((FRAGMENTS, blocks, page), dtype=torch.uint8)
    out_rows = [row_items(out[i]) for i in range(FRAGMENTS)]
    step = max(1, CHUNK // page)

    def chunked(a: np.ndarray, b: np.ndarray) -> Callable[[], None]:
        pairs = [(a[s : s + step], b[s : s + step]) for s in range(0, blocks, step)]

        def run() -> None:
            for ga, cb in pairs:
                for f, s in zip(src_rows, dst_rows, strict=True):
                    s[cb] = f[ga]

        return run

    def gather_take() -> None:
        for f, o in zip(src_rows, out_rows, strict=True):
            np.take(f, g, out=o, mode="clip")

    def gather_getitem() -> None:
        for s in range(0, blocks, step):
            ga = g[s : s + step]
            for f, o in zip(src_rows, out_rows, strict=True):
                o[s : s + len(ga)] = f[ga]

    src_bytes = [f.numpy() for f in frags]
    dst_bytes = [col.numpy() for col in slab_cols]
    pairs_rc = list(zip(g.tolist(), c.tolist(), strict=True))

    def by_row() -> None:
        for gi, ci in pairs_rc:
            for f, s in zip(src_bytes, dst_bytes, strict=True):
                np.copyto(s[ci], f[gi])

    base = slab.data_ptr()
    addresses = [
        (base + ci * page * FRAGMENTS + i * page, f.data_ptr() + gi * page)
        for gi, ci in pairs_rc
        for i, f in enumerate(frags)
    ]

    def memmove_rows() -> None:
        for d, s in addresses:
            ctypes.memmove(d, s, page)

    src = torch.ones(blocks * page * FRAGMENTS, dtype=torch.uint8)
    dst = torch.empty_like(src)
    a_np, b_np = src.numpy(), dst.numpy()
    fns: dict[str, Callable[[], object]] = {
        "plain1": lambda: dst.copy_(src),
        "np_copyto": lambda: np.copyto(b_np, a_np),
        "rows_in_order": chunked(np.arange(blocks), np.arange(blocks)),
        "scattered": chunked(g, c),
        "by_row": by_row,
        "gather_take": gather_take,
        "gather_getitem": gather_getitem,
        "memmove_rows": memmove_rows,
    }
    native = native_row_copier()
    if native is not None:
        route = native.route(frags, slab_cols)
        fns["native_memmove"] = lambda: route.copy(g, c, stream=False)
        fns["native_stream"] = lambda: route.copy(g, c, stream=True)
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[k].append(time.process_time() - t0)
    nbytes = blocks * page * FRAGMENTS
    return {k: round(nbytes / statistics.median(v) / 1e9, 2) for k, v in times.items()}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/hostcopy-floor.json"
    torch.set_num_threads(1)
    load = [os.getloadavg()[0]]
    rows = []
    for page, blocks in CASES:
        rows.append({"page_bytes": page, "blocks": blocks, "gbps": case(page, blocks, 15)})
        print(rows[-1], flush=True)
    load.append(os.getloadavg()[0])
    result = {
        "benchmark": "hostcopy_floor",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {"fragments": FRAGMENTS, "chunk": CHUNK, "repeats": 15, "load_1min": load},
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
