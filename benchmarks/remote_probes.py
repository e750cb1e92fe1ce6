"""What the remote benchmark scripts share: the server's and the client's CPU, one
timed pass with both, batches of values written or loaded from a pool of threads, a
plain loopback socket, and ``redis-benchmark``'s SET or GET rate as the reference."""

from __future__ import annotations

import csv
import io
import resource
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import redis


def server_cpu(url: str) -> float:
    """CPU seconds the server has used (``INFO cpu``)."""
    with redis.Redis.from_url(url) as c:
        info = c.info("cpu")
    return float(info["used_cpu_sys"] + info["used_cpu_user"])


def usage() -> tuple[float, float, float, float]:
    """User and system CPU seconds, voluntary and involuntary context switches of this
    process (every thread) and its waited-for children (redis-benchmark)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        a.ru_utime + b.ru_utime,
        a.ru_stime + b.ru_stime,
        a.ru_nvcsw + b.ru_nvcsw,
        a.ru_nivcsw + b.ru_nivcsw,
    )


def redis_benchmark_rate(
    port: int | str, test: str, size: int, count: int, pipeline: int, clients: int
) -> float:
    """``redis-benchmark -t <test>`` (``set`` or ``get``) of ``size``-byte values over
    ``count`` keys on ``clients`` connections, ``pipeline`` deep; payload GB/s by its own
    clock (its start-up not counted). A ``get`` pass wants its keys written first
    (``kvtier.bench.remote.fill_keyspace``)."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-d", str(size), "-t", test]
    cmd += ["-P", str(pipeline), "-c", str(clients), "-n", str(count), "-r", str(count), "--csv"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    (row,) = csv.DictReader(io.StringIO(out))
    return float(row["rps"]) * size / 1e9


def measured(run: Callable[[], object], nbytes: int, url: str) -> dict[str, float]:
    """GB/s of ``run()``, and the client's and server's CPU per wall second and per GB
    (the client's also split into user and system time, with its context switches).

    A ``run`` that returns a float gives GB/s by its own clock (``redis_benchmark_rate``,
    whose start-up is not counted); the CPU figures are by ours either way. The client
    is this process and its waited-for children (``getrusage``).
    """
    s0, u0, t0 = server_cpu(url), usage(), time.perf_counter()
    own = run()
    wall = time.perf_counter() - t0
    u1, s1 = usage(), server_cpu(url)
    user, system = u1[0] - u0[0], u1[1] - u0[1]
    server = s1 - s0
    gb = nbytes / 1e9
    return {
        "gbps": own if isinstance(own, float) else gb / wall,
        "client_cpu": (user + system) / wall,
        "server_cpu": server / wall,
        "client_cpu_s_per_gb": (user + system) / gb,
        "server_cpu_s_per_gb": server / gb,
        "user_s_per_gb": user / gb,
        "sys_s_per_gb": system / gb,
        "vol_cs_per_mb": (u1[2] - u0[2]) / (nbytes / (1 << 20)),
        "invol_cs_per_mb": (u1[3] - u0[3]) / (nbytes / (1 << 20)),
    }


def median_rows(
    runs: dict[str, list[dict[str, float]]], runs_of: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """One row per pass: the median of each figure ``measured`` over the repeats, then
    the repeats themselves (``<figure>_runs``) of the figures in ``runs_of`` (every
    figure when ``None``), each rounded to 3 decimals."""
    rows = []
    for name, got in runs.items():
        row: dict[str, Any] = {"pass": name}
        for k in got[0]:
            row[k] = round(statistics.median(r[k] for r in got), 3)
        for k in got[0]:
            if runs_of is None or k in runs_of:
                row[k + "_runs"] = [round(r[k], 3) for r in got]
        rows.append(row)
    return rows


def connect(port: int, blocking: bool = True) -> socket.socket:
    """A loopback TCP connection to the server, ``TCP_NODELAY`` as redis-py's."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(blocking)
    return s


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


def read_in_threads(
    store: Any,
    keys: Sequence[bytes],
    pages: Sequence[np.ndarray] | np.ndarray,
    threads: int,
    depth: int,
) -> None:
    """Load every key into its page with ``store.read_many_into`` (a ``RemoteStore`` of
    any tree), ``depth`` values a call from ``threads`` threads; raises unless every
    value was a hit."""

    def read(batch: list[bytes], outs: list[np.ndarray]) -> None:
        if not all(o.value == "hit" for o in store.read_many_into(batch, outs)):
            raise RuntimeError("a load missed")

    write_in_threads(read, keys, pages, threads, depth)
