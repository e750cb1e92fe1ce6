"""The fixed cost of one small GPU<->CPU job (CPU stand-in), piece by piece, two trees.

Run from the repository root: ``python benchmarks/hostcopy_fixed.py BASE_SRC [rounds]
[out.json]``. Each round runs the pieces once per tree, the trees alternating, each in
its own process (a process imports one ``kvtier``). In a process, for each case (page
size x blocks, 2 layers = 4 fragments, random GPU and host ids, block_size_factor 1),
the pieces run round-robin ``REPEATS`` times after a warm-up, warm caches:

* ``plan``: ``blockmap.plan_rows`` of the store job;
* ``copy``: the store's ``HostPageCopier.copy`` of that plan (bounds checks and the C
  call; the copy of the job's bytes itself included);
* ``lane``: a no-op job through a ``ThreadLane``: submit, ``wait``, ``poll``;
* ``store`` / ``load``: one handler job, submit to ``wait`` to ``get_finished``;
* ``plain1``: torch ``copy_`` of the job's bytes on one thread (the reference).

Each is timed in wall and thread CPU time; the output keeps per-piece medians and
10th percentiles (the 2-core VM is shared: the low percentile is the quiet case) of
every round, and the summary the medians over rounds, per tree.

``python benchmarks/hostcopy_fixed.py --plan [out.json]`` instead times ``plan_rows``
alone in this tree, its list path against its numpy path (``SMALL_JOB_ROWS`` set
above and below the job), alternating in one process, for jobs of 16-1024 GPU blocks
with block_size_factor 1 and 4, stores and loads: where the threshold belongs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from tree_rounds import alternate, commit_of

CASES = ((8192, 16), (16384, 16), (65536, 16), (8192, 64), (8192, 256))
REPEATS = 300
LAYERS = 2


def measure_case(page: int, blocks: int) -> dict[str, Any]:
    """One case in this process: per piece, (median, 10th percentile) of wall and CPU us."""
    import numpy as np
    import torch

    from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout
    from kvtier.worker.blockmap import plan_rows
    from kvtier.worker.lanes import ThreadLane

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
    copier = g2c._copier
    nbytes = blocks * h.kv_view.page_bytes
    src = torch.full((nbytes,), 1, dtype=torch.uint8)
    dst = torch.full((nbytes,), 2, dtype=torch.uint8)
    lane = ThreadLane("noop")
    counter = iter(range(10**9))

    def plan() -> Any:
        return plan_rows(
            store[0],
            store[1],
            block_size_factor=1,
            num_gpu_blocks=2 * blocks,
            num_cpu_blocks=2 * blocks,
            gpu_is_dst=False,
        )

    the_plan = plan()

    def noop() -> tuple[int, None]:
        return 0, None

    def lane_job() -> None:
        i = next(counter)
        lane.submit(i, noop)
        lane.wait([i])
        lane.poll()

    def job(handler: Any, spec: Any) -> None:
        i = next(counter)
        handler.transfer_async(i, spec)
        handler.wait([i])
        (r,) = handler.get_finished()
        assert r.success, r.error

    fns = {
        "plan": plan,
        "copy": lambda: copier.copy(the_plan, True),
        "lane": lane_job,
        "store": lambda: job(g2c, store),
        "load": lambda: job(c2g, load),
        "plain1": lambda: dst.copy_(src),
    }
    for fn in fns.values():
        for _ in range(30):
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(REPEATS):
        for k, fn in fns.items():
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.thread_time() - c0)
    lane.close()
    h.shutdown()

    def stats(v: list[float]) -> list[float]:
        return [
            round(statistics.median(v) * 1e6, 2),
            round(statistics.quantiles(v, n=10)[0] * 1e6, 2),
        ]

    out = {
        "page_bytes": page,
        "blocks": blocks,
        "wall_us": {k: stats(v) for k, v in wall.items()},
        "cpu_us": {k: stats(v) for k, v in cpu.items()},
    }
    print(page, blocks, out["wall_us"], flush=True)
    return out


def plan_ab(out: str) -> None:
    """``plan_rows``: list path against numpy path, alternating, thread CPU us."""
    import numpy as np

    from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvtier.results import git_commit, machine_info
    from kvtier.worker import blockmap

    rng = np.random.default_rng(0)
    rows = []
    load = [os.getloadavg()[0]]
    for factor in (1, 4):
        for gpu_blocks in (16, 32, 64, 128, 256, 1024):
            m = gpu_blocks // factor
            gpu = GPULoadStoreSpec(tuple(rng.permutation(2 * gpu_blocks)[:gpu_blocks].tolist()))
            cpu = CPULoadStoreSpec(tuple(rng.permutation(2 * m)[:m].tolist()))
            for gpu_is_dst in (False, True):
                times: dict[str, list[float]] = {"list": [], "numpy": []}
                for k in range(4000 // max(16, gpu_blocks // 8)):
                    for path in ("list", "numpy") if k % 2 == 0 else ("numpy", "list"):
                        blockmap.SMALL_JOB_ROWS = 10**9 if path == "list" else 0
                        c0 = time.thread_time()
                        blockmap.plan_rows(
                            gpu,
                            cpu,
                            block_size_factor=factor,
                            num_gpu_blocks=2 * gpu_blocks,
                            num_cpu_blocks=2 * m,
                            gpu_is_dst=gpu_is_dst,
                        )
                        times[path].append(time.thread_time() - c0)
                med = {k: round(statistics.median(v[10:]) * 1e6, 2) for k, v in times.items()}
                row = {"factor": factor, "gpu_blocks": gpu_blocks, "load": gpu_is_dst, "us": med}
                print(row, f"list/numpy {med['list'] / med['numpy']:.2f}", flush=True)
                rows.append(row)
    load.append(os.getloadavg()[0])
    result = {
        "benchmark": "hostcopy_fixed_plan",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {"clock": "thread CPU time, median", "load_average_1min": load},
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree, case and piece: medians over rounds of (median, p10) wall and CPU us."""
    out: dict[str, Any] = {}
    for tree in ("base", "new"):
        per_case: dict[str, Any] = {}
        for page, blocks in CASES:
            cases = [
                c
                for r in rounds
                if r["tree"] == tree
                for c in r["cases"]
                if (c["page_bytes"], c["blocks"]) == (page, blocks)
            ]
            entry = {}
            for clock in ("wall_us", "cpu_us"):
                entry[clock] = {
                    k: [round(statistics.median(c[clock][k][i] for c in cases), 2) for i in (0, 1)]
                    for k in cases[0][clock]
                }
            per_case[f"{page // 1024}KiB x {blocks}"] = entry
        out[tree] = per_case
    return out


def main() -> None:
    if sys.argv[1] == "--child":
        print("RESULT " + json.dumps([measure_case(p, b) for p, b in CASES]), flush=True)
        return
    if sys.argv[1] == "--plan":
        sys.path.insert(0, os.path.abspath("src"))
        plan_ab(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-plan.json")
        return
    base_src = os.path.abspath(sys.argv[1])
    rounds_n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    out = sys.argv[3] if len(sys.argv) > 3 else "benchmarks/results/hostcopy-fixed.json"
    new_src = os.path.abspath("src")
    sys.path.insert(0, new_src)
    from kvtier.results import git_commit, machine_info

    rounds, loads = alternate(__file__, [], base_src, new_src, rounds_n)
    summary = summarize(rounds)
    result = {
        "benchmark": "hostcopy_fixed",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "base_src": base_src,
            "base_commit": commit_of(base_src),
            "new_commit": commit_of(new_src),
            "cases": CASES,
            "layers": LAYERS,
            "repeats": REPEATS,
            "rounds": rounds_n,
            "load_average_1min": loads,
        },
        "summary": summary,
        "rounds": rounds,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for case in summary["new"]:
        for clock in ("wall_us", "cpu_us"):
            b, n = summary["base"][case][clock], summary["new"][case][clock]
            print(case, clock, "base", b, "new", n)


if __name__ == "__main__":
    main()
