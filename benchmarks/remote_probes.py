"""What the remote-store benchmark scripts share: the server's and the client's CPU, one
timed pass with both, batches of values written from a pool of threads, and
``redis-benchmark``'s SET rate as the reference."""

from __future__ import annotations

import csv
import io
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import redis


def server_cpu(url: str) -> float:
    """CPU seconds the server has used (``INFO cpu``)."""
    with redis.Redis.from_url(url) as c:
        info = c.info("cpu")
    return float(info["used_cpu_sys"] + info["used_cpu_user"])


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children (redis-benchmark)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def redis_benchmark_set(
    port: int | str, size: int, count: int, pipeline: int, clients: int
) -> float:
    """``redis-benchmark -t set`` of ``size``-byte values over ``count`` keys on
    ``clients`` connections, ``pipeline`` deep; payload GB/s by its own clock (its
    start-up not counted)."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-d", str(size), "-t", "set"]
    cmd += ["-P", str(pipeline), "-c", str(clients), "-n", str(count), "-r", str(count), "--csv"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    (row,) = csv.DictReader(io.StringIO(out))
    return float(row["rps"]) * size / 1e9


def measured(run: Callable[[], object], nbytes: int, url: str) -> dict[str, float]:
    """GB/s of ``run()`` and the client's and server's CPU, per wall second and per GB.

    A ``run`` that returns a float gives GB/s by its own clock (``redis_benchmark_set``,
    whose start-up is not counted); the CPU figures are by ours either way.
    """
    s0, c0, t0 = server_cpu(url), time.process_time() + children_cpu(), time.perf_counter()
    own = run()
    wall = time.perf_counter() - t0
    client = time.process_time() + children_cpu() - c0
    server = server_cpu(url) - s0
    gb = nbytes / 1e9
    return {
        "gbps": own if isinstance(own, float) else gb / wall,
        "client_cpu": client / wall,
        "server_cpu": server / wall,
        "client_cpu_s_per_gb": client / gb,
        "server_cpu_s_per_gb": server / gb,
    }


def batches(count: int, depth: int) -> list[range]:
    """Indices ``0..count-1`` in consecutive batches of ``depth`` (the last may be short)."""
    return [range(s, min(s + depth, count)) for s in range(0, count, depth)]


def write_in_threads(
    write: Callable[[list[bytes], list[np.ndarray]], object],
    keys: Sequence[bytes],
    pages: Sequence[np.ndarray] | np.ndarray,
    threads: int,
    depth: int,
) -> None:
    """``write`` every key's page, ``depth`` values a call, from ``threads`` threads that
    take the next batch as they finish one; raises if any thread failed."""
    jobs = iter(batches(len(keys), depth))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                with lock:
                    job = next(jobs, None)
                if job is None:
                    return
                write([keys[i] for i in job], [pages[i] for i in job])
        except BaseException as e:  # a pass that failed must not be timed as done
            errors.append(e)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {threads} threads failed") from errors[0]
