"""The CPU<->remote handlers of this tree against an older tree's, side by side in one
process: GB/s, client and server CPU seconds per GB of stores and loads.

Run from the repository root: ``PYTHONPATH=<dir>:src:benchmarks python
benchmarks/remote_handler_ab.py <repeats> <out.json> [value bytes] [io threads] [job
blocks]`` where ``<dir>`` holds the older tree's ``kvtier`` renamed ``kvtier_base`` (see
``remote_client_ab.py``). Both trees' ``CpuRemoteOffloadingHandlers`` store and load
the same pages (``AB_MIB`` MiB a pass, default 256) under their own fingerprints on one
``redis-server``, in jobs of ``job blocks`` values (default 8) with ``io threads``
(default 2) as ``remote_io_threads`` (``AB_CONTENDERS`` names the contenders, and knobs of this
tree's loop: see ``CONTENDERS``): every job of a pass is submitted at once, then
waited for, as ``kvtier bench remote`` does. ``rbP`` and ``rb1`` are
``redis-benchmark -t set|get -P <job blocks>|1 -c <io threads> -r <values>`` over as
many keys (its ``GET`` keys written first), its client CPU counted as a child's.
Passes alternate (stores, then loads) after one warm-up round, each round starting
one contender later than the last (the second pass of a round costs more, whichever
it is); medians of ``repeats``. The client CPU is this process's (``getrusage``,
every thread), which a loaded machine disturbs far less than GB/s.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from functools import partial
from typing import Any

import numpy as np
import torch
from remote_probes import measured, median_rows, redis_benchmark_rate

from kvtier.bench.remote import fill_keyspace, local_server
from kvtier.bench.report import git_commit, machine_info

TOTAL = int(os.environ.get("AB_MIB", "256")) << 20
OPS = os.environ.get("AB_OPS", "store,load").split(",")
"""The operations measured (``AB_OPS``, comma separated: ``store``, ``load``)."""
CONTENDERS = os.environ.get("AB_CONTENDERS", "kvtier_base,kvtier").split(",")
"""``package[:knob=value...]``: knobs of this tree's loop, ``io`` (connections, default
the command line's), ``w`` (``remote_values.WINDOW_BYTES``, KiB), ``sw``
(``remote_loop.STORE_WINDOW_BYTES``, KiB)."""


def contender(spec: str, io: int) -> tuple[str, int, dict[str, int]]:
    package, *knobs = spec.split(":")
    settings = {k: int(v) for k, v in (knob.split("=") for knob in knobs)}
    return package, settings.pop("io", io), settings


def knobs(package: str, settings: dict[str, int]) -> None:
    """Set this tree's windows for the next pass (the defaults where not given)."""
    if package != "kvtier":
        return
    from kvtier.media import remote_loop, remote_values

    remote_values.WINDOW_BYTES = settings.get("w", DEFAULTS[0] >> 10) << 10
    remote_loop.STORE_WINDOW_BYTES = settings.get("sw", DEFAULTS[1] >> 10) << 10


def _defaults() -> tuple[int, int]:
    from kvtier.media import remote_values

    try:
        from kvtier.media import remote_loop
    except ImportError:
        return remote_values.WINDOW_BYTES, 0
    return remote_values.WINDOW_BYTES, remote_loop.STORE_WINDOW_BYTES


DEFAULTS = _defaults()


def handlers(package: str, url: str, fingerprint: bytes, pages: torch.Tensor, io: int) -> Any:
    remote = importlib.import_module(f"{package}.media.remote")
    cpu_remote = importlib.import_module(f"{package}.worker.cpu_remote")
    options = remote.RemoteOptions(url=url, max_connections=2 * io + 2, timeout_s=30.0)
    store = remote.RemoteStore.open(fingerprint, options, environ={})
    return cpu_remote.CpuRemoteOffloadingHandlers(pages, store, io_threads=io)


def one_pass(package: str, group: Any, op: str, keys: list[bytes], depth: int) -> None:
    """Every key stored (or loaded) in jobs of ``depth``, all submitted, then waited for."""
    specs = importlib.import_module(f"{package}.load_store_specs")
    handler = group.cpu_to_remote_handler if op == "store" else group.remote_to_cpu_handler
    jobs = []
    for start in range(0, len(keys), depth):
        ids = tuple(range(start, min(start + depth, len(keys))))
        cpu = specs.CPULoadStoreSpec(ids)
        remote = specs.RemoteLoadStoreSpec(ids, tuple(keys[i] for i in ids))
        job = len(jobs) + 1
        handler.transfer_async(job, (cpu, remote) if op == "store" else (remote, cpu))
        jobs.append(job)
    handler.wait(jobs)
    failed = [r for r in handler.get_finished() if not r.success]
    if failed:
        raise RuntimeError(f"{len(failed)} jobs failed, first: {failed[0].error}")


def main() -> None:
    repeats, out = int(sys.argv[1]), sys.argv[2]
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256 << 10
    io = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    depth = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    count = TOTAL // size
    pages = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (count, size), np.uint8))
    keys = [i.to_bytes(32, "big") for i in range(count)]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {}
    with local_server((len(CONTENDERS) + 2) * TOTAL + (64 << 20)) as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        groups = {}
        for i, spec in enumerate(CONTENDERS):
            if spec.startswith("rb"):
                continue
            package, n, settings = contender(spec, io)
            group = handlers(package, url, bytes([i + 1]) * 32, pages, n)
            groups[spec] = (package, settings, group)
        try:
            for op in OPS:
                if op == "load" and any(c.startswith("rb") for c in CONTENDERS):
                    fill_keyspace(url, size, count)
                if op == "load" and "store" not in OPS:  # the values to load, untimed
                    for package, _, group in groups.values():
                        one_pass(package, group, "store", keys, depth)
                for rep in range(repeats + 1):
                    shift = rep % len(CONTENDERS)
                    for spec in CONTENDERS[shift:] + CONTENDERS[:shift]:
                        if spec.startswith("rb"):
                            pipeline = 1 if spec == "rb1" else depth
                            test = "set" if op == "store" else "get"
                            run: Any = partial(
                                redis_benchmark_rate, port, test, size, count, pipeline, io
                            )
                        else:
                            package, settings, group = groups[spec]
                            knobs(package, settings)
                            run = partial(one_pass, package, group, op, keys, depth)
                        got = measured(run, TOTAL, url)
                        if rep:
                            runs.setdefault(f"{op} {spec}", []).append(got)
        finally:
            for _, _, group in groups.values():
                group.shutdown()
    rows = median_rows(runs)
    for row in rows:  # against the faster redis-benchmark of the same operation
        op, name = row["pass"].split(" ", 1)
        refs = [r["gbps"] for r in rows if r["pass"] in (f"{op} rbP", f"{op} rb1")]
        if refs and not name.startswith("rb"):
            row["ratio_to_redis_benchmark"] = round(row["gbps"] / max(refs), 3)
    for row in rows:
        name = row["pass"]
        print(
            f"{name:26} GB/s {row['gbps']:.3f}  client CPU s/GB {row['client_cpu_s_per_gb']:.3f}"
            f" (user {row['user_s_per_gb']:.3f})  server {row['server_cpu_s_per_gb']:.3f}"
            f"  vol cs/MB {row['vol_cs_per_mb']:.2f}"
            f"  ratio {row.get('ratio_to_redis_benchmark', '-')}"
        )
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    with open(out, "x") as f:
        json.dump(
            {
                "benchmark": "remote_handler_ab",
                "machine": machine_info(),
                "commit": git_commit(),
                "config": {
                    "value_bytes": size,
                    "bytes_per_pass": TOTAL,
                    "repeats": repeats,
                    "io_threads": io,
                    "job_blocks": depth,
                    "contenders": CONTENDERS,
                },
                "load_average_before": load_before,
                "load_average_after": load_after,
                "rows": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
