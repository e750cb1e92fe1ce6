"""Where the time of a remote load goes: kvtier's loads against minimal readers and
``redis-benchmark -t get``, side by side in one process, with the client's user and
system CPU and context switches per GB.

Run from the repository root: ``PYTHONPATH=src:benchmarks python
benchmarks/remote_load_probe.py <repeats> <out.json> <value bytes> <setting> ...``.
Starts its own ``redis-server``, stores ``PROBE_MIB`` (default 256) MiB of values once
(kvtier's under its keys, the raw readers' under ``raw:%08d``, redis-benchmark's
``key:%012d``), then runs the settings in turn, ``repeats`` times after one warm-up
round; medians. Settings:

* ``kvtierTxD``: ``RemoteStore.read_many_into`` on ``T`` threads, ``D`` values a call;
  ``kvtierTxDwK``: the same with ``remote_values.WINDOW_BYTES`` set to ``K`` KiB (the
  requests kept outstanding per connection); ``baseTxD``: the older tree's store
  (``kvtier_base`` on ``PYTHONPATH``, see ``remote_client_ab.py``);
* ``rawTxD``: ``T`` threads, each on its own socket with a timeout (as redis-py's:
  CPython polls before every call), sending ``D`` ``GET`` at once and receiving each
  reply with ``recvmsg_into`` straight into its line, page and CRLF buffers (no
  parsing, no checks: the least a Python reader can do);
* ``rawnbTxD``: the same on a non-blocking socket, ``recvmsg_into`` tried first and a
  ``poll`` only when nothing is there;
* ``loopCxD``: one thread, ``C`` non-blocking connections, ``D`` values in flight on
  each (redis-benchmark's shape);
* ``rbPxC``: ``redis-benchmark -t get -P P -c C -r <values>`` (its CPU is its own
  process's: ``children`` CPU).

The CPU of this process is ``getrusage`` (every thread), which a loaded machine
disturbs less than the wall-clock rate. The timing, the threads and redis-benchmark's
runs are ``remote_probes``' (shared with the other ``remote_*`` scripts).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import selectors
import socket
import sys
import threading
from collections.abc import Callable, Iterator
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

from kvtier.bench.remote import fill_keyspace, local_server
from kvtier.bench.report import git_commit, machine_info

TOTAL = int(os.environ.get("PROBE_MIB", "256")) << 20


def gets(names: list[bytes]) -> bytes:
    return b"".join(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(n), n) for n in names)


def fill(sock: socket.socket, bufs: list[memoryview], nonblocking: bool) -> None:
    """Fill ``bufs`` in order from ``sock``."""
    i = 0
    while i < len(bufs):
        if nonblocking:
            try:
                got = sock.recvmsg_into(bufs[i:])[0]
            except BlockingIOError:
                p = select.poll()
                p.register(sock, select.POLLIN)
                p.poll(30_000)
                continue
        else:
            got = sock.recvmsg_into(bufs[i:])[0]
        if not got:
            raise ConnectionError("closed")
        while i < len(bufs) and got >= len(bufs[i]):
            got -= len(bufs[i])
            i += 1
        if got:
            bufs[i] = bufs[i][got:]


def raw_pass(port: int, size: int, pages: np.ndarray, t: int, d: int, nb: bool) -> None:
    jobs = iter(batches(len(pages), d))
    lock = threading.Lock()
    socks = [connect(port) for _ in range(t)]
    for s in socks:
        s.settimeout(0.0 if nb else 30.0)
    line = b"$%d\r\n" % size

    def worker(sock: socket.socket) -> None:
        head, crlf = bytearray(len(line)), bytearray(2)
        while True:
            with lock:
                job = next(jobs, None)
            if job is None:
                return
            sock.sendall(gets([b"raw:%08d" % i for i in job]))
            for i in job:
                fill(sock, [memoryview(head), memoryview(pages[i]), memoryview(crlf)], nb)
                if head != line or crlf != b"\r\n":
                    raise ConnectionError("a reply that is not the value")

    pool = [threading.Thread(target=worker, args=(s,)) for s in socks]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    for s in socks:
        s.close()


def loop_pass(port: int, size: int, pages: np.ndarray, c: int, d: int) -> None:
    """One thread, ``c`` non-blocking connections, one batch of ``d`` in flight on each."""
    jobs = iter(batches(len(pages), d))
    sel = selectors.DefaultSelector()
    line = b"$%d\r\n" % size
    state: dict[socket.socket, list[Any]] = {}

    def start(sock: socket.socket) -> bool:
        job = next(jobs, None)
        if job is None:
            return False
        sock.setblocking(True)
        sock.sendall(gets([b"raw:%08d" % i for i in job]))
        sock.setblocking(False)
        bufs = []
        for i in job:
            bufs += [
                memoryview(bytearray(len(line))),
                memoryview(pages[i]),
                memoryview(bytearray(2)),
            ]
        state[sock] = [bufs, 0]
        return True

    live = 0
    for _ in range(c):
        s = connect(port)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        live += start(s)
    while live:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            st = state[sock]
            bufs, i = st
            try:
                got = sock.recvmsg_into(bufs[i : i + 64])[0]
            except BlockingIOError:
                continue
            if not got:
                raise ConnectionError("closed")
            while i < len(bufs) and got >= len(bufs[i]):
                got -= len(bufs[i])
                i += 1
            if got:
                bufs[i] = bufs[i][got:]
            st[1] = i
            if i == len(bufs) and not start(sock):
                sel.unregister(sock)
                sock.close()
                live -= 1


@contextlib.contextmanager
def windowed(window_bytes: int | None) -> Iterator[None]:
    """kvtier's loads with ``WINDOW_BYTES`` set to ``window_bytes`` (``None``: as is)."""
    from kvtier.media import remote_values

    kept = remote_values.WINDOW_BYTES
    if window_bytes is not None:
        remote_values.WINDOW_BYTES = window_bytes
    try:
        yield
    finally:
        remote_values.WINDOW_BYTES = kept


def base_store(url: str) -> Any:
    """The older tree's store (``kvtier_base``, see ``remote_client_ab.py``), its values
    written under their own fingerprint by ``main``."""
    from kvtier_base.media.remote import RemoteOptions, RemoteStore

    options = RemoteOptions(url=url, max_connections=16, timeout_s=30.0)
    return RemoteStore.open(b"\x07" * 32, options, environ={})


def main() -> None:
    repeats, out, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    settings = sys.argv[4:]
    count = TOTAL // size
    pages = np.random.default_rng(1).integers(0, 256, (count, size), dtype=np.uint8)
    keys = [i.to_bytes(32, "big") for i in range(count)]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {}
    with local_server(4 * TOTAL + (256 << 20)) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        from kvtier.media.remote import RemoteOptions, RemoteStore

        store = RemoteStore.open(
            b"\x07" * 32, RemoteOptions(url=url, max_connections=16, timeout_s=30.0), environ={}
        )
        write_in_threads(store.write_many, keys, pages, 2, 8)
        import redis

        with redis.Redis.from_url(url) as c:
            for i in range(count):
                c.set(b"raw:%08d" % i, pages[i].tobytes())
        fill_keyspace(url, size, count)
        passes: dict[str, Callable[[], float | None]] = {}
        for s in settings:
            m = re.fullmatch(r"([a-z]+)(\d+)x(\d+)(?:w(\d+))?", s)
            if m is None:
                raise SystemExit(f"a setting is KINDAxB, got {s!r}")
            kind, t, d = m[1], int(m[2]), int(m[3])
            outs = np.zeros_like(pages)
            if kind == "rb":
                passes[s] = lambda p=t, c=d: redis_benchmark_rate(port, "get", size, count, p, c)
            elif kind in ("kvtier", "base"):
                st = store if kind == "kvtier" else base_store(url)
                window = int(m[4]) << 10 if m[4] else None

                def run_kv(
                    t: int = t, d: int = d, o: Any = outs, st: Any = st, w: Any = window
                ) -> None:
                    with windowed(w):
                        read_in_threads(st, keys, o, t, d)

                passes[s] = run_kv
            elif kind in ("raw", "rawnb"):
                passes[s] = lambda t=t, d=d, o=outs, nb=kind == "rawnb": raw_pass(
                    port, size, o, t, d, nb
                )
            elif kind == "loop":
                passes[s] = lambda t=t, d=d, o=outs: loop_pass(port, size, o, t, d)
            else:
                raise SystemExit(f"unknown setting {s!r}")
        for rep in range(repeats + 1):
            for name, run in passes.items():
                got = measured(run, TOTAL, url)
                if rep:
                    runs.setdefault(name, []).append(got)
    rows = median_rows(runs, ("gbps",))
    for row in rows:
        name = row["pass"]
        print(f"{name:12} " + " ".join(f"{k} {v}" for k, v in row.items() if k != "pass"))
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    with open(out, "x") as f:
        json.dump(
            {
                "benchmark": "remote_load_probe",
                "machine": machine_info(),
                "commit": git_commit(),
                "config": {"value_bytes": size, "bytes_per_pass": TOTAL, "repeats": repeats},
                "load_average_before": load_before,
                "load_average_after": load_after,
                "rows": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
