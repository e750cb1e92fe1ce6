"""kvtier's remote client against an older kvtier, side by side in one process: CPU
seconds per GB and GB/s of stores and loads.

Run from the repository root: ``PYTHONPATH=<dir>:src python benchmarks/remote_client_ab.py
<repeats> <out.json> [value bytes] [threads x depth, ...]`` where ``<dir>`` holds the
older tree's ``kvtier`` package renamed ``kvtier_base`` (``git archive <commit> src |
tar -x -C /tmp/t && cp -r /tmp/t/src/kvtier <dir>/kvtier_base``, then its imports
rewritten: ``sed -i -E 's/\\bfrom kvtier(\\.| import)/from kvtier_base\\1/g; s/\\bimport
kvtier\\b/import kvtier_base/g'`` over its ``.py`` files). Both clients write and read
the same pages under their own fingerprints on one ``redis-server``; passes alternate
(base, new; stores, then loads) after one warm-up round; the figures are medians of
``repeats``. The client CPU is this process's (``getrusage``: every thread),
which a loaded machine disturbs far less than the wall-clock rate. ``AB_MIB`` sets
the MiB per pass (default 256), ``AB_OPS`` the operations (default ``store,load``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from functools import partial
from typing import Any

import numpy as np
from remote_probes import measured, median_rows, read_in_threads, write_in_threads

from kvtier.bench.remote import local_server
from kvtier.bench.report import git_commit, machine_info

TOTAL = int(os.environ.get("AB_MIB", "256")) << 20
OPS = os.environ.get("AB_OPS", "store,load").split(",")
"""The operations measured (``AB_OPS``, comma separated: ``store``, ``load``)."""


def client(package: str, url: str, fingerprint: bytes) -> Any:
    remote = importlib.import_module(f"{package}.media.remote")
    options = remote.RemoteOptions(url=url, max_connections=16, timeout_s=30.0)
    return remote.RemoteStore.open(fingerprint, options, environ={})


def one_pass(store: Any, op: str, keys: list[bytes], pages: np.ndarray, t: int, d: int) -> None:
    """Store (``op == "store"``) or load every key's page on ``t`` threads, ``d`` a call."""
    if op == "store":
        write_in_threads(store.write_many, keys, pages, t, d)
    else:
        read_in_threads(store, keys, pages, t, d)


def main() -> None:
    repeats = int(sys.argv[1])
    out = sys.argv[2]
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256 << 10
    shapes = [tuple(int(x) for x in s.split("x")) for s in (sys.argv[4:] or ["4x8", "1x8"])]
    count = TOTAL // size
    pages = np.random.default_rng(1).integers(0, 256, (count, size), dtype=np.uint8)
    keys = [i.to_bytes(32, "big") for i in range(count)]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {}
    with local_server(3 * TOTAL + (64 << 20)) as url:
        stores = {
            p: client(p, url, bytes([i + 1]) * 32) for i, p in enumerate(("kvtier_base", "kvtier"))
        }
        if "store" not in OPS:  # the values the loads read, stored once
            for store in stores.values():
                write_in_threads(store.write_many, keys, pages, 2, 8)
        for t, d in shapes:
            for op in OPS:
                for rep in range(repeats + 1):
                    for package, store in stores.items():
                        run = partial(one_pass, store, op, keys, pages, t, d)
                        got = measured(run, TOTAL, url)
                        if rep:
                            runs.setdefault(f"{op} {t}x{d} {package}", []).append(got)
    rows = median_rows(runs)
    for row in rows:
        name = row["pass"]
        print(
            f"{name:24} GB/s {row['gbps']:.3f}  client CPU s/GB {row['client_cpu_s_per_gb']:.3f} "
            f"{row['client_cpu_s_per_gb_runs']}  server {row['server_cpu_s_per_gb']:.3f}"
        )
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    with open(out, "x") as f:
        json.dump(
            {
                "benchmark": "remote_client_ab",
                "machine": machine_info(),
                "commit": git_commit(),
                "config": {
                    "value_bytes": size,
                    "bytes_per_pass": TOTAL,
                    "repeats": repeats,
                    "shapes": [f"{t}x{d}" for t, d in shapes],
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
