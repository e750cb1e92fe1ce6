"""A lane's doorbell, side by side in one process: what a waited-on small job costs and
how late a job nobody waits for starts (CPU stand-in, ``kvtier.worker.doorbell``).

Run from the repository root: ``python benchmarks/hostcopy_doorbell.py [rounds]
[out.json]``. One process, one ``HostPageCopier`` per case, and one store handler per
doorbell, each with its own ``ThreadLane``: ``python`` (``PyDoorbell``: the worker
sleeps on a ``threading.Condition``, as before the compiled doorbell), ``native0``
(``NativeDoorbell`` with no grace) and ``native`` (``NativeDoorbell``, ``GRACE_NS``).
Per round and case (page x 16 blocks, 2 layers = 4 fragments, random ids, warm), the
doorbells run round-robin (the order rotating), ``REPEATS`` times each:

* ``waited``: ``transfer_async``, ``wait``, ``get_finished`` of one store job, wall
  and thread CPU us (the bench's g2c); then ~100 us of ``time.sleep``, so the worker
  is asleep at the next submit, as between the bench's jobs;
* ``unwaited``: a no-op job submitted while the caller then sleeps 2 ms (the GIL
  free): us from ``submit`` to the job starting on the lane's thread.

Prints, and writes to JSON, the median over rounds of each round's median.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.abspath("src"))

CASES = ((8192, 16), (16384, 16))
REPEATS = 200
LAYERS = 2


def one_round(page: int, blocks: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout
    from kvtier.worker.doorbell import NativeDoorbell, PyDoorbell
    from kvtier.worker.gpu_cpu import SingleDirectionHandler
    from kvtier.worker.lanes import ThreadLane
    from kvtier.worker.rowcopy import native_row_copier

    native = native_row_copier()
    assert native is not None, "the compiled doorbell needs the native library"
    rng = np.random.default_rng(0)
    kv = [
        torch.empty((2, 2 * blocks, 16, 1, page // 32), dtype=torch.float16) for _ in range(LAYERS)
    ]
    for t in kv:
        t.view(torch.int16).random_(-(2**15), 2**15 - 1)
    h = CpuGpuOffloadingHandlers(kv, 16, 16, 2 * blocks, KVLayout.KV_FIRST)
    h.host_slab.tensor.fill_(1)
    g, c = rng.permutation(2 * blocks).tolist(), rng.permutation(2 * blocks).tolist()
    store = (GPULoadStoreSpec(tuple(g[:blocks])), CPULoadStoreSpec(tuple(c[:blocks])))
    bells = {
        "python": PyDoorbell(),
        "native0": NativeDoorbell(native, 0),
        "native": NativeDoorbell(native),
    }
    handlers = {
        name: SingleDirectionHandler(
            gpu_to_cpu=True,
            copier=h.gpu_to_cpu_handler._copier,
            lane=ThreadLane(f"bench-{name}", bell),
            block_size_factor=1,
            num_gpu_blocks=2 * blocks,
            num_cpu_blocks=2 * blocks,
        )
        for name, bell in bells.items()
    }
    counter = iter(range(10**9))
    wall: dict[str, list[float]] = {k: [] for k in bells}
    cpu: dict[str, list[float]] = {k: [] for k in bells}
    late: dict[str, list[float]] = {k: [] for k in bells}
    names = list(bells)
    for rep in range(REPEATS + 20):
        order = names[rep % 3 :] + names[: rep % 3]
        for name in order:
            hd = handlers[name]
            i = next(counter)
            c0, t0 = time.thread_time(), time.perf_counter()
            hd.transfer_async(i, store)
            hd.wait([i])
            (r,) = hd.get_finished()
            t1, c1 = time.perf_counter(), time.thread_time()
            assert r.success, r.error
            if rep >= 20:
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
            time.sleep(0.0001)
        for name in order:
            lane, started = handlers[name]._lane, []
            i = next(counter)

            def mark(started: list[float] = started) -> tuple[int, None]:
                started.append(time.perf_counter())
                return 0, None

            t0 = time.perf_counter()
            lane.submit(i, mark)
            time.sleep(0.002)
            lane.wait([i])
            lane.poll()
            if rep >= 20:
                late[name].append(started[0] - t0)
    for hd in handlers.values():
        hd.shutdown()
    h.shutdown()

    def med(v: list[float]) -> float:
        return round(statistics.median(v) * 1e6, 2)

    return {
        name: {
            "waited_wall_us": med(wall[name]),
            "waited_cpu_us": med(cpu[name]),
            "unwaited_start_us": med(late[name]),
        }
        for name in bells
    }


def main() -> None:
    from kvtier.results import git_commit, machine_info

    rounds_n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/hostcopy-doorbell.json"
    loads = [os.getloadavg()[0]]
    rounds = []
    for k in range(rounds_n):
        for page, blocks in CASES:
            res = one_round(page, blocks)
            rounds.append({"round": k, "page_bytes": page, "blocks": blocks, "us": res})
            print(k, page, blocks, res, flush=True)
        loads.append(os.getloadavg()[0])
    summary: dict[str, Any] = {}
    for page, blocks in CASES:
        rs = [r["us"] for r in rounds if (r["page_bytes"], r["blocks"]) == (page, blocks)]
        summary[f"{page // 1024}KiB x {blocks}"] = {
            name: {m: round(statistics.median(r[name][m] for r in rs), 2) for m in rs[0][name]}
            for name in rs[0]
        }
    result = {
        "benchmark": "hostcopy_doorbell",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
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
    for case, by_bell in summary.items():
        print(case, by_bell)


if __name__ == "__main__":
    main()
