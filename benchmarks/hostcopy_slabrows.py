"""The host side of the CUDA copier's scattered path: a route per job against a cached one.

Run from the repository root: ``python benchmarks/hostcopy_slabrows.py [repeats]
[out.json]`` (this tree, one process, CPU tensors: no GPU needed). For each case
(page bytes x rows, random slab rows) it times, alternating job by job, warm caches,
one thread, thread CPU and wall:

* ``per_job``: what ``pagecopy.SlabRows`` did before routes were cached: build a
  ``RowRoute`` from the job's buffer to the slab, then copy (one call);
* ``cached``: ``SlabRows.scatter`` / ``gather`` as now: the direction's route, built
  once, pointed at the job's buffer for the call only (``RowRoute.copy(through=)``);
* ``route``: building the route alone (no copy).

Scatter (buffer -> slab, after a store's device-to-host copy) and gather (slab ->
buffer, before a load's host-to-device copy) both; medians in us.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

CASES = ((32768, 16), (131072, 16), (32768, 256), (1048576, 16))
"""(page bytes, rows): an 8 KiB-fragment x 4 page x 16 rows, and so on."""


def measure(repeats: int) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    from kvtier.worker.rowcopy import native_row_copier

    torch.set_num_threads(1)
    native = native_row_copier()
    if native is None:
        raise SystemExit("the compiled row copier is not built here")
    rng = np.random.default_rng(0)
    return [measure_case(native, page, n, rng, repeats) for page, n in CASES]


def measure_case(native: Any, page: int, n: int, rng: Any, repeats: int) -> dict[str, Any]:
    """One case: per variant, median wall and thread CPU us."""
    import numpy as np
    import torch

    from kvtier.worker.pagecopy import SlabRows

    slab = torch.ones((4 * n, page), dtype=torch.uint8)
    rows = rng.permutation(4 * n)[:n].astype(np.int64)
    own = np.arange(n, dtype=np.int64)
    buffer = torch.full((n, page), 2, dtype=torch.uint8)
    moved = SlabRows(slab)

    def per_job_scatter() -> None:
        native.route([buffer], [slab], ("buffer", "host")).copy(own, rows)

    def per_job_gather() -> None:
        native.route([slab], [buffer], ("host", "buffer")).copy(rows, own)

    fns = {
        "per_job scatter": per_job_scatter,
        "cached scatter": lambda: moved.scatter(buffer, rows),
        "per_job gather": per_job_gather,
        "cached gather": lambda: moved.gather(rows, buffer),
        "route": lambda: native.route([buffer], [slab], ("buffer", "host")),
    }
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for k in range(20 + repeats):
        order = list(fns.items()) if k % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            t1, c1 = time.perf_counter(), time.thread_time()
            if k >= 20:
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    case = {
        "page_bytes": page,
        "rows": n,
        "wall_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in wall.items()},
        "cpu_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in cpu.items()},
    }
    print(page, n, "cpu us", case["cpu_us"], flush=True)
    return case


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    path = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-slabrows.json"
    sys.path.insert(0, os.path.abspath("src"))
    from kvtier.results import git_commit, machine_info

    loads = [os.getloadavg()[0]]
    cases = measure(repeats)
    loads.append(os.getloadavg()[0])
    result = {
        "benchmark": "hostcopy_slabrows",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "cases": CASES,
            "repeats": repeats,
            "clock": "thread CPU and wall, medians, warm, one thread",
            "load_average_1min": loads,
        },
        "cases": cases,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
