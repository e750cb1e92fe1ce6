"""GPU<->CPU handlers of two trees side by side in one run (CPU stand-in), whole jobs.

Run from the repository root: ``python benchmarks/transfer_ab.py BASE_SRC [rounds]
[out.json]``, where ``BASE_SRC`` is the ``src`` folder of the tree to compare with
(e.g. a ``git worktree add /tmp/base <commit>``). Each round runs the grid once per
tree, the trees alternating, each in its own process (a process imports one
``kvtier``); a case is the median of ``--repeats`` round-robin passes over: ``plain``
(torch ``copy_`` of the job's bytes on all torch threads, the bench's reference),
``plain1`` (the same on one thread), ``gather`` (the bare gather of the store's
scattered rows of every fragment into one buffer, ``np.take(mode="clip")``), and the
handler jobs ``g2c``, ``c2g`` (submit, ``wait``, ``get_finished``: what
``kvtier bench transfer`` calls wall) with the copy time they report (lane); each
also in process CPU time, which a loaded machine disturbs less than wall time (the
2-thread ``plain`` spins, so its CPU time is not compared). The output keeps every
round; the summary gives, per tree, medians over rounds and over jobs >= 16 blocks
of each page size, of the job's bandwidth over each reference's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from tree_rounds import alternate, commit_of

PAGES = (8192, 16384, 65536, 262144)
BLOCKS = (16, 256, 4096)
MAX_JOB = 128 << 20
LAYERS = 2


def measure_grid(repeats: int) -> list[dict[str, Any]]:
    """Run in the child: every case with the ``kvtier`` found on ``sys.path``."""
    rows_out = []
    for page in PAGES:
        for blocks in BLOCKS:
            if blocks * page * 2 * LAYERS > MAX_JOB:
                continue
            for ids in ("random", "contiguous"):
                rows_out.append(measure_case(page, blocks, ids, repeats))
    return rows_out


def measure_case(page: int, blocks: int, ids: str, repeats: int) -> dict[str, Any]:
    """One case: medians of wall and process CPU seconds of each function."""
    import numpy as np
    import torch

    from kvtier.blocks import BlockId
    from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout

    gen = torch.Generator().manual_seed(0)
    kv = [
        torch.empty((2, 2 * blocks, 16, 1, page // 32), dtype=torch.float16) for _ in range(LAYERS)
    ]
    for t in kv:
        t.view(torch.int16).random_(-(2**15), 2**15 - 1)
    h = CpuGpuOffloadingHandlers(kv, 16, 16, 2 * blocks, KVLayout.KV_FIRST)
    h.host_slab.tensor.fill_(1)
    nbytes = blocks * h.kv_view.page_bytes
    g = torch.randperm(2 * blocks, generator=gen).tolist()
    c = (
        torch.randperm(2 * blocks, generator=gen).tolist()
        if ids == "random"
        else list(range(2 * blocks))
    )
    gb, cb = tuple(BlockId(x) for x in g), tuple(BlockId(x) for x in c)
    store = (GPULoadStoreSpec(gb[:blocks]), CPULoadStoreSpec(cb[:blocks]))
    load = (CPULoadStoreSpec(cb[blocks:]), GPULoadStoreSpec(gb[blocks:]))
    src = torch.full((nbytes,), 1, dtype=torch.uint8)
    dst = torch.full((nbytes,), 2, dtype=torch.uint8)
    frags = h.kv_view.fragments
    index = np.asarray(g[:blocks], dtype=np.int64)
    width = int(frags[0].shape[1])
    src_rows = [f.numpy().view(f"V{width}").reshape(-1) for f in frags]
    dst_rows = dst.numpy().view(f"V{width}").reshape(len(frags), blocks)
    counter = iter(range(10**9))
    lanes: dict[str, list[float]] = {"g2c": [], "c2g": []}
    threads = torch.get_num_threads()

    def job(handler: Any, spec: Any, name: str) -> None:
        i = next(counter)
        handler.transfer_async(i, spec)
        handler.wait([i])
        (r,) = handler.get_finished()
        assert r.success, r.error
        lanes[name].append(r.seconds)

    def plain1() -> None:
        torch.set_num_threads(1)
        dst.copy_(src)
        torch.set_num_threads(threads)

    def gather() -> None:
        for s, d in zip(src_rows, dst_rows, strict=True):
            np.take(s, index, out=d, mode="clip")

    fns = {
        "plain": lambda: dst.copy_(src),
        "plain1": plain1,
        "gather": gather,
        "g2c": lambda: job(h.gpu_to_cpu_handler, store, "g2c"),
        "c2g": lambda: job(h.cpu_to_gpu_handler, load, "c2g"),
    }
    for fn in fns.values():
        fn()
    lanes["g2c"].clear()
    lanes["c2g"].clear()
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    h.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    med.update({f"lane_{k}": statistics.median(v) for k, v in lanes.items()})
    print(page, blocks, ids, {k: round(v * 1e6) for k, v in med.items()}, flush=True)
    return {
        "page_bytes": page,
        "blocks": blocks,
        "ids": ids,
        "job_bytes": nbytes,
        "seconds": med,
        "cpu_seconds": {k: statistics.median(v) for k, v in cpu.items()},
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree and page size: medians of job bandwidth / reference bandwidth."""
    out: dict[str, Any] = {}
    for tree in ("base", "new"):
        per_page: dict[str, Any] = {}
        for page in PAGES:
            cases = [
                c
                for r in rounds
                if r["tree"] == tree
                for c in r["cases"]
                if c["page_bytes"] == page and c["blocks"] >= 16
            ]
            if not cases:
                continue
            entry = {}
            for ref in ("plain", "plain1", "gather"):
                for job in ("g2c", "c2g", "lane_g2c", "lane_c2g"):
                    vals = [c["seconds"][ref] / c["seconds"][job] for c in cases]
                    entry[f"{job}/{ref}"] = round(statistics.median(vals), 3)
            for ref in ("plain1", "gather"):  # process CPU time: one thread each
                for job in ("g2c", "c2g"):
                    vals = [c["cpu_seconds"][ref] / c["cpu_seconds"][job] for c in cases]
                    entry[f"cpu {job}/{ref}"] = round(statistics.median(vals), 3)
            entry["g2c us (median case)"] = round(
                statistics.median(c["seconds"]["g2c"] for c in cases) * 1e6
            )
            per_page[f"{page // 1024}KiB"] = entry
        out[tree] = per_page
    return out


def main() -> None:
    if sys.argv[1] == "--child":
        print("RESULT " + json.dumps(measure_grid(int(sys.argv[2]))), flush=True)
        return
    base_src = os.path.abspath(sys.argv[1])
    rounds_n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    out = sys.argv[3] if len(sys.argv) > 3 else "benchmarks/results/transfer-ab.json"
    new_src = os.path.abspath("src")
    sys.path.insert(0, new_src)
    from kvtier.bench.report import git_commit, machine_info

    rounds, loads = alternate(__file__, ["3"], base_src, new_src, rounds_n)
    summary = summarize(rounds)
    result = {
        "benchmark": "transfer_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "base_commit": commit_of(base_src),
            "new_commit": commit_of(new_src),
            "pages": PAGES,
            "blocks": BLOCKS,
            "layers": LAYERS,
            "rounds": rounds_n,
            "repeats": 3,
            "load_average_1min": loads,
        },
        "summary": summary,
        "rounds": rounds,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for tree, pages in summary.items():
        for page, entry in pages.items():
            print(tree, page, entry)


if __name__ == "__main__":
    main()
