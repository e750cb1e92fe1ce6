"""Where a small GPU<->CPU job should run: in the submitting thread, or on the lane's.

Run from the repository root: ``python benchmarks/hostcopy_inline.py [rounds] [out.json]``
(this tree only, one process). For each case (page size x blocks, 2 layers = 4
fragments, random GPU and host ids, block_size_factor 1) both handlers of one
``CpuGpuOffloadingHandlers`` run every pattern below ``REPEATS`` times per round in two
modes, alternating job by job: ``inline`` (``ThreadLane.inline_max_bytes`` above the
job: an idle lane runs it in the caller's thread) and ``async`` (below it: the lane's
worker thread is woken for it). Patterns, each timed in wall, caller thread CPU and process CPU:

* ``wait``: ``transfer_async``, ``wait``, ``get_finished`` (what ``kvtier bench
  transfer`` times): a caller that waits anyway;
* ``overlap``: ``transfer_async``, then ``WORK_US`` of pure Python (holding the GIL, as
  an engine's host-side step does), then ``wait`` and ``get_finished``: a caller with
  work to overlap, where an asynchronous job can hide behind the work and an inline
  one cannot;
* ``overlap_nogil``: the same with ``WORK_US`` of a one-thread ``torch.mm`` instead,
  which releases the GIL (a forward pass on the CPU stand-in): the lane's thread can
  copy meanwhile on another core, the best case for ``async``;
* ``submit``: ``transfer_async`` alone (what a caller that never waits pays; the job is
  then waited for outside the timer);
* ``both``: a store and a load submitted together, then both waited for.

Process CPU time (every thread of the process: the lane's thread too) is kept
beside the caller's thread CPU time. The output keeps per round, case, mode and
pattern the median, and the summary the
medians over rounds with inline - async per pattern: the crossover is the job size
where ``overlap`` stops favouring inline.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

CASES = (
    (8192, 1),
    (8192, 2),
    (8192, 4),
    (8192, 8),
    (8192, 16),
    (8192, 32),
    (8192, 64),
    (16384, 16),
    (16384, 32),
    (65536, 4),
    (65536, 8),
    (65536, 16),
)
REPEATS = 200
LAYERS = 2
WORK_US = 300
PATTERNS = ("wait", "overlap", "overlap_nogil", "submit", "both")
MODES = ("inline", "async")


def _spin(iterations: int) -> None:
    x = 0
    for i in range(iterations):
        x += i


def _calibrate() -> tuple[int, int]:
    """Loop iterations of ``_spin``, and the side of the square float32 matrix whose
    one-thread ``torch.mm`` (GIL released), that take about ``WORK_US`` each."""
    import torch

    torch.set_num_threads(1)
    n = 10000
    while True:
        c0 = time.thread_time()
        _spin(n)
        took = time.thread_time() - c0
        if took > 2e-3:
            break
        n *= 2
    spin = max(1, int(n * WORK_US * 1e-6 / took))
    side = 32
    while True:
        a = torch.ones((side, side))
        torch.mm(a, a)
        times = []
        for _ in range(20):
            c0 = time.thread_time()
            torch.mm(a, a)
            times.append(time.thread_time() - c0)
        if statistics.median(times) > WORK_US * 1e-6:
            return spin, side
        side += 16


def measure_case(page: int, blocks: int, spin: int, side: int) -> dict[str, Any]:
    """One case in this process: per mode and pattern, median wall and CPU us."""
    import numpy as np
    import torch

    from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    kv = [
        torch.empty((2, 2 * blocks, 16, 1, page // 32), dtype=torch.float16) for _ in range(LAYERS)
    ]
    for t in kv:
        t.view(torch.int16).random_(-(2**15), 2**15 - 1)
    h = CpuGpuOffloadingHandlers(kv, 16, 16, 2 * blocks, KVLayout.KV_FIRST)
    h.host_slab.tensor.fill_(1)
    g = rng.permutation(2 * blocks).tolist()
    c = rng.permutation(2 * blocks).tolist()
    store = (GPULoadStoreSpec(tuple(g[:blocks])), CPULoadStoreSpec(tuple(c[:blocks])))
    load = (CPULoadStoreSpec(tuple(c[blocks:])), GPULoadStoreSpec(tuple(g[blocks:])))
    g2c, c2g = h.gpu_to_cpu_handler, h.cpu_to_gpu_handler
    lanes = [g2c._lane, c2g._lane]
    counter = iter(range(10**9))

    def finish(handler: Any, ids: list[int]) -> None:
        handler.wait(ids)
        for r in handler.get_finished():
            assert r.success, r.error

    def wait() -> None:
        i = next(counter)
        g2c.transfer_async(i, store)
        finish(g2c, [i])

    def overlap() -> None:
        i = next(counter)
        g2c.transfer_async(i, store)
        _spin(spin)
        finish(g2c, [i])

    mat = torch.ones((side, side))

    def overlap_nogil() -> None:
        i = next(counter)
        g2c.transfer_async(i, store)
        torch.mm(mat, mat)
        finish(g2c, [i])

    def both() -> None:
        i, j = next(counter), next(counter)
        g2c.transfer_async(i, store)
        c2g.transfer_async(j, load)
        finish(g2c, [i])
        finish(c2g, [j])

    wall: dict[str, list[float]] = {f"{m} {p}": [] for m in MODES for p in PATTERNS}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    proc: dict[str, list[float]] = {k: [] for k in wall}
    fns = {"wait": wait, "overlap": overlap, "overlap_nogil": overlap_nogil, "both": both}
    for k in range(30 + REPEATS):
        for mode in MODES if k % 2 == 0 else MODES[::-1]:
            for lane in lanes:
                lane.inline_max_bytes = 1 << 62 if mode == "inline" else -1
            for pattern in PATTERNS:
                i = next(counter)
                p0, c0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
                if pattern == "submit":
                    g2c.transfer_async(i, store)
                else:
                    fns[pattern]()
                t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
                if pattern == "submit":
                    finish(g2c, [i])
                if k >= 30:
                    wall[f"{mode} {pattern}"].append(t1 - t0)
                    cpu[f"{mode} {pattern}"].append(c1 - c0)
                    proc[f"{mode} {pattern}"].append(p1 - p0)
    h.shutdown()
    out = {
        "page_bytes": page,
        "blocks": blocks,
        "job_bytes": blocks * h.kv_view.page_bytes,
        "wall_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in wall.items()},
        "cpu_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in cpu.items()},
        "process_cpu_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in proc.items()},
    }
    w = out["wall_us"]
    print(
        page,
        blocks,
        " ".join(f"{p} {w[f'inline {p}']:.0f}/{w[f'async {p}']:.0f}" for p in PATTERNS),
        flush=True,
    )
    return out


def main() -> None:
    rounds_n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-inline.json"
    sys.path.insert(0, os.path.abspath("src"))
    from kvtier.results import git_commit, machine_info

    spin, side = _calibrate()
    loads = [os.getloadavg()[0]]
    rounds = []
    for r in range(rounds_n):
        cases = CASES if r % 2 == 0 else CASES[::-1]
        rounds.append([measure_case(p, b, spin, side) for p, b in cases])
        loads.append(os.getloadavg()[0])
        print(f"round {r} done, load {loads[-1]:.2f}", flush=True)
    summary = {}
    for page, blocks in CASES:
        per = [c for rnd in rounds for c in rnd if (c["page_bytes"], c["blocks"]) == (page, blocks)]
        entry: dict[str, Any] = {"job_bytes": per[0]["job_bytes"]}
        for clock in ("wall_us", "cpu_us", "process_cpu_us"):
            med = {k: round(statistics.median(c[clock][k] for c in per), 2) for k in per[0][clock]}
            entry[clock] = med
            entry[f"{clock}_inline_minus_async"] = {
                p: round(med[f"inline {p}"] - med[f"async {p}"], 2) for p in PATTERNS
            }
        summary[f"{page // 1024}KiB x {blocks}"] = entry
    result = {
        "benchmark": "hostcopy_inline",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "cases": CASES,
            "layers": LAYERS,
            "repeats": REPEATS,
            "rounds": rounds_n,
            "work_us": WORK_US,
            "spin_iterations": spin,
            "matrix_side": side,
            "clock": "wall, caller thread CPU, process CPU; medians of medians",
            "load_average_1min": loads,
        },
        "summary": summary,
        "rounds": rounds,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for case, e in summary.items():
        print(
            case,
            e["job_bytes"],
            "wall inline-async",
            e["wall_us_inline_minus_async"],
            "cpu",
            e["cpu_us_inline_minus_async"],
            "process cpu",
            e["process_cpu_us_inline_minus_async"],
        )


if __name__ == "__main__":
    main()
