"""Remote stores, old and new write path side by side in one run, against redis-benchmark.

Run from the repository root: ``PYTHONPATH=src python benchmarks/remote_write_ab.py
[repeats] [out.json] [value bytes]``. Starts its own ``redis-server`` (as ``kvtier bench
remote`` does). ``--total``-like 128 MiB of values per pass, written by ``threads``
Python threads, each taking batches of ``depth`` values (as the CPU->remote handler's
I/O threads take jobs):

* ``redispy``: the previous path, redis-py's pipeline with ``ValuePacker`` (header
  and page as their own buffers, one ``sendall`` per buffer, hiredis for replies);
* ``sendmsg``: ``RemoteStore.write_many`` now (``set_from_pages``: one ``sendmsg`` per
  batch, replies read by ``ReplyReader``).

Both checksum and frame every value the same way. The reference is ``redis-benchmark
-t set -d <size> -c 4 -r <values>`` at ``-P 8`` and ``-P 1``; passes alternate after one
warm-up round. Also recorded, for every pass (redis-benchmark's too): the client's and
the server's CPU seconds per wall second (``process_time`` or the child's ``rusage``,
and the server's ``INFO cpu``), and the same per GB stored, which says what each side
costs the two cores it shares with the server whatever else the machine is running.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from remote_probes import measured, median_rows, redis_benchmark_rate, write_in_threads

from kvtier.bench.remote import local_server
from kvtier.bench.report import git_commit, machine_info
from kvtier.media.redis_client import RemoteOptions
from kvtier.media.remote import RemoteStore

TOTAL = 128 << 20
SETTINGS = tuple(
    tuple(map(int, s.split("x"))) for s in os.environ.get("AB_SETTINGS", "4x8,2x8,1x16").split(",")
)
"""(threads, values per batch) of each pass; ``AB_SETTINGS=4x8,4x1`` chooses others."""

Write = Callable[[list[bytes], list[np.ndarray]], object]


def redispy_write(store: RemoteStore) -> Write:
    """The write path before this change: one redis-py pipeline per batch."""

    def write(keys: list[bytes], pages: list[np.ndarray]) -> None:
        def queue(pipe: Any) -> None:
            for k, p in zip(keys, pages, strict=True):
                pipe.set(store.redis_key(k), store._value(k, p))

        results = store._execute(queue)
        assert not any(isinstance(r, Exception) for r in results), results

    return write


def timed(
    write: Write, keys: list[bytes], pages: np.ndarray, threads: int, depth: int, url: str
) -> dict[str, float]:
    return measured(
        lambda: write_in_threads(write, keys, pages, threads, depth),
        len(keys) * pages.shape[1],
        url,
    )


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/remote-write-ab.json"
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256 << 10
    count = TOTAL // size
    pages = np.random.default_rng(0).integers(0, 256, (count, size), dtype=np.uint8)
    keys = [i.to_bytes(32, "big") for i in range(count)]
    load_before = os.getloadavg()
    with local_server(4 * TOTAL) as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        options = RemoteOptions(url=url, max_connections=16, timeout_s=30.0)
        store = RemoteStore.open(b"\x07" * 32, options, environ={})
        paths: dict[str, Write] = {"redispy": redispy_write(store), "sendmsg": store.write_many}
        runs: dict[str, list[dict[str, float]]] = {}
        for rep in range(repeats + 1):
            for threads, depth in SETTINGS:
                for name, write in paths.items():
                    got = timed(write, keys, pages, threads, depth, url)
                    if rep:
                        runs.setdefault(f"{name} t{threads} d{depth}", []).append(got)
            for p in (8, 1):
                got = measured(  # GB/s by its own clock, CPU by ours
                    lambda p=p: redis_benchmark_rate(port, "set", size, count, p, 4), TOTAL, url
                )
                if rep:
                    runs.setdefault(f"redis-benchmark -P {p}", []).append(got)
        store.close()
    ref = max(statistics.median(r["gbps"] for r in runs[f"redis-benchmark -P {p}"]) for p in (8, 1))
    rows = median_rows(runs, ())
    for row in rows:
        name = row["pass"]
        row["ratio"] = round(row["gbps"] / ref, 3)
        print(f"{name:22} " + " ".join(f"{k} {v}" for k, v in row.items() if k != "pass"))
    result = {
        "benchmark": "remote_write_ab",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {"value_bytes": size, "bytes_per_pass": TOTAL, "repeats": repeats},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
