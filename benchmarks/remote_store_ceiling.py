"""How fast can Python store 256 KiB values in Redis at all? Minimal senders, no kvtier code.

Run from the repository root: ``PYTHONPATH=src python benchmarks/remote_store_ceiling.py
[repeats] [out.json] [value bytes]``. Starts its own ``redis-server`` (kvtier's
``local_server``, the only kvtier code used) and stores 128 MiB of values per pass over
as many keys, with senders that do nothing but frame a ``SET`` and move bytes:

* ``threads TxD``: ``T`` Python threads, each with its own blocking socket, each taking
  batches of ``D`` values: one ``sendmsg`` of the batch, then read its ``D`` replies
  (what kvtier's store path does, without checksum, header or pool);
* ``timeout TxD``, ``timeoutlowat TxD``: ``threads`` with a socket timeout (CPython
  then polls before every call, as on redis-py's sockets), and that with
  ``SO_RCVLOWAT`` set to the batch's least reply bytes (one wake-up for all of its
  replies). ``SO_RCVLOWAT`` on a blocking socket without a timeout hung ``recv`` here
  (Linux, loopback), so it is not offered without one;
* ``overlap TxD``: the same, but each thread sends batch ``k+1`` before it reads the
  replies of batch ``k`` (two batches in flight per connection);
* ``loop CxD``: one Python thread driving ``C`` non-blocking sockets with ``selectors``,
  ``D`` values in flight on each (redis-benchmark's shape: one event loop);
* ``kvtier TxD``: ``RemoteStore.write_many`` on ``T`` threads (checksum, header, pool);
  ``kvtiernolowat TxD``: the same without ``SO_RCVLOWAT`` (``replies_awaited`` made a
  no-op: the store path before it);
* ``kvtierload TxD``: ``RemoteStore.read_many_into`` of the same values on ``T``
  threads (its ``ratio`` is still to redis-benchmark's ``SET``: read its CPU per GB);
* ``rbPxC``: ``redis-benchmark -t set -P P -c C -r <values>``.

Passes alternate, after one warm-up round; medians of GB/s and of client and server
CPU seconds per GB. ``AB_SETTINGS`` picks the passes (comma separated, e.g.
``threads4x8,loop4x1,rb1x4``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import socket
import statistics
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from remote_probes import (
    batches,
    connect,
    measured,
    median_rows,
    read_in_threads,
    redis_benchmark_rate,
    write_in_threads,
)

from kvtier.bench.remote import local_server
from kvtier.bench.report import git_commit, machine_info

TOTAL = int(os.environ.get("CEILING_MIB", "128")) << 20
"""Bytes per pass (``CEILING_MIB``, default 128)."""
DEFAULT = (
    "threads4x8,threads4x1,threads1x8,overlap4x8,overlap1x8,loop4x1,loop4x8,"
    "kvtier4x8,kvtier1x8,rb8x4,rb1x4"
)
SETTINGS = os.environ.get("AB_SETTINGS", DEFAULT).split(",")


def frames(count: int, size: int) -> list[list[Any]]:
    """Per value, the buffers of ``SET key value``: RESP head, the value, CRLF."""
    payload = np.random.default_rng(0).integers(0, 256, (count, size), dtype=np.uint8)
    out = []
    for i in range(count):
        key = b"ceil:%08d" % i
        head = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, size)
        out.append([head, memoryview(payload[i]).cast("B"), b"\r\n"])
    return out


def send_all(sock: socket.socket, bufs: list[Any]) -> None:
    views = [memoryview(b).cast("B") for b in bufs]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + 1024])
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


def read_oks(sock: socket.socket, n: int) -> None:
    want, got = 5 * n, b""
    while len(got) < want:
        chunk = sock.recv(want - len(got))
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    if got != b"+OK\r\n" * n:
        raise ConnectionError(got[:40])


def threads_pass(
    port: int,
    fr: list[list[Any]],
    t: int,
    d: int,
    overlap: bool,
    timeout: float | None = None,
    lowat: bool = False,
) -> None:
    jobs = iter(batches(len(fr), d))
    lock = threading.Lock()
    socks = [connect(port) for _ in range(t)]
    for s in socks:
        s.settimeout(timeout)

    def worker(sock: socket.socket) -> None:
        pending = 0
        while True:
            with lock:
                job = next(jobs, None)
            if job is None:
                break
            send_all(sock, [b for i in job for b in fr[i]])
            if lowat:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 5 * len(job))
            if overlap:
                if pending:
                    read_oks(sock, pending)
                pending = len(job)
            else:
                read_oks(sock, len(job))
        if pending:
            read_oks(sock, pending)

    pool = [threading.Thread(target=worker, args=(s,)) for s in socks]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    for s in socks:
        s.close()


def loop_pass(port: int, fr: list[list[Any]], c: int, d: int) -> None:
    """One thread, ``c`` non-blocking connections, ``d`` values in flight on each."""
    jobs = iter(batches(len(fr), d))
    sel = selectors.DefaultSelector()
    state: dict[socket.socket, dict[str, Any]] = {}

    def start(sock: socket.socket) -> bool:
        job = next(jobs, None)
        if job is None:
            return False
        views = [memoryview(b).cast("B") for i in job for b in fr[i]]
        state[sock] = {"views": views, "i": 0, "want": 5 * len(job), "got": 0}
        sel.modify(sock, selectors.EVENT_WRITE) if sock in sel.get_map() else sel.register(
            sock, selectors.EVENT_WRITE
        )
        return True

    live = 0
    for _ in range(c):
        s = connect(port, blocking=False)
        if start(s):
            live += 1
    while live:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            st = state[sock]
            if st["i"] < len(st["views"]):
                views, i = st["views"], st["i"]
                try:
                    sent = sock.sendmsg(views[i : i + 1024])
                except BlockingIOError:
                    continue
                while i < len(views) and sent >= views[i].nbytes:
                    sent -= views[i].nbytes
                    i += 1
                if sent:
                    views[i] = views[i][sent:]
                st["i"] = i
                if i == len(views):
                    sel.modify(sock, selectors.EVENT_READ)
            else:
                try:
                    data = sock.recv(st["want"] - st["got"])
                except BlockingIOError:
                    continue
                if not data:
                    raise ConnectionError("closed")
                st["got"] += len(data)
                if st["got"] == st["want"] and not start(sock):
                    sel.unregister(sock)
                    sock.close()
                    live -= 1


def kvtier_pass(
    url: str, count: int, size: int, t: int, d: int, lowat: bool = True, load: bool = False
) -> Callable[[], None]:
    from kvtier.media import remote_values
    from kvtier.media.redis_client import RemoteOptions
    from kvtier.media.remote import RemoteStore

    awaited = remote_values.replies_awaited

    store = RemoteStore.open(
        b"\x07" * 32, RemoteOptions(url=url, max_connections=16, timeout_s=30.0), environ={}
    )
    pages = np.random.default_rng(1).integers(0, 256, (count, size), dtype=np.uint8)
    keys = [i.to_bytes(32, "big") for i in range(count)]

    if load:  # the values to read back, stored once
        write_in_threads(store.write_many, keys, pages, t, d)

        return lambda: read_in_threads(store, keys, pages, t, d)

    def run() -> None:
        if not lowat:  # the store path before SO_RCVLOWAT
            remote_values.replies_awaited = lambda sock, nbytes: contextlib.nullcontext()  # type: ignore[assignment]
        try:
            write_in_threads(store.write_many, keys, pages, t, d)
        finally:
            remote_values.replies_awaited = awaited

    return run


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/remote-store-ceiling.json"
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256 << 10
    count = TOTAL // size
    fr = frames(count, size)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {}
    with local_server(4 * TOTAL) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        passes: dict[str, Callable[[], float | None]] = {}
        for s in SETTINGS:
            m = re.fullmatch(r"([a-z]+)(\d+)x(\d+)", s)
            if m is None:
                raise SystemExit(f"a setting is KINDAxB, got {s!r}")
            kind, t, d = m[1], int(m[2]), int(m[3])
            if kind == "rb":  # rbPxC: -P P -c C
                passes[s] = lambda p=t, c=d: redis_benchmark_rate(port, "set", size, count, p, c)
                continue
            if kind == "threads":
                passes[s] = lambda t=t, d=d: threads_pass(port, fr, t, d, overlap=False)
            elif kind == "timeout":
                passes[s] = lambda t=t, d=d: threads_pass(port, fr, t, d, False, timeout=30.0)
            elif kind == "timeoutlowat":
                passes[s] = lambda t=t, d=d: threads_pass(
                    port, fr, t, d, False, timeout=30.0, lowat=True
                )
            elif kind == "overlap":
                passes[s] = lambda t=t, d=d: threads_pass(port, fr, t, d, overlap=True)
            elif kind == "loop":
                passes[s] = lambda t=t, d=d: loop_pass(port, fr, t, d)
            elif kind == "kvtiernolowat":
                passes[s] = kvtier_pass(url, count, size, t, d, lowat=False)  # type: ignore[assignment]
            elif kind == "kvtierload":
                passes[s] = kvtier_pass(url, count, size, t, d, load=True)  # type: ignore[assignment]
            elif kind == "kvtier":
                passes[s] = kvtier_pass(url, count, size, t, d)  # type: ignore[assignment]
            else:
                raise SystemExit(f"unknown setting {s!r}")
        for rep in range(repeats + 1):
            for name, run in passes.items():
                got = measured(run, TOTAL, url)
                if rep:
                    runs.setdefault(name, []).append(got)
    ref = max(
        (
            statistics.median(r["gbps"] for r in v)
            for k, v in runs.items()
            if k.startswith("rb") and k.endswith("x4")
        ),
        default=float("nan"),
    )
    rows = median_rows(runs, ())
    for row in rows:
        name = row["pass"]
        row["ratio"] = round(row["gbps"] / ref, 3)
        print(f"{name:12} " + " ".join(f"{k} {v}" for k, v in row.items() if k != "pass"))
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    result = {
        "benchmark": "remote_store_ceiling",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {"value_bytes": size, "bytes_per_pass": TOTAL, "repeats": repeats},
        "settings": SETTINGS,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
