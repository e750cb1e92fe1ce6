"""Measurements the remote-store benchmark scripts share: the server's and the client's
CPU, and ``redis-benchmark``'s SET rate as the reference."""

from __future__ import annotations

import csv
import io
import resource
import subprocess

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
