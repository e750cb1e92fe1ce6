"""CPU per value of reading verified GET replies, kvtier against an older kvtier,
without a server: another process writes the replies into a socket pair.

Run from the repository root: ``PYTHONPATH=<dir>:src python benchmarks/remote_reader_ab.py
<repeats> [value bytes] [values]`` with ``<dir>`` holding the older tree as
``kvtier_base`` (see ``remote_client_ab.py``). Per pass, a child process writes
``values`` replies to ``GET`` (each a block kvtier stored: header and payload) into a
new Unix socket pair, and this process reads them with ``get_into_pages``' reader
(``remote_values.receive``) into pages, verifying each; passes alternate between the
two trees after one warm-up each. Reported: medians of this process's CPU time
(``time.process_time``, the reader alone: the writer is another process) per value.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import socket
import statistics
import sys
import time

import numpy as np


def writer(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.close()


def main() -> None:
    repeats = int(sys.argv[1])
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 10
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    packages = ("kvtier_base", "kvtier")
    fp = b"\x05" * 32
    keys = [i.to_bytes(32, "big") for i in range(count)]
    pages = np.random.default_rng(0).integers(0, 256, (count, size), dtype=np.uint8)
    fmt = importlib.import_module("kvtier.media.block_format")
    replies = b"".join(
        b"$%d\r\n" % (104 + size)
        + fmt.encode_header(k, fp, memoryview(p).cast("B"))
        + p.tobytes()
        + b"\r\n"
        for k, p in zip(keys, pages, strict=True)
    )
    modules = {p: importlib.import_module(f"{p}.media.remote_values") for p in packages}
    clients = {p: importlib.import_module(f"{p}.media.redis_client") for p in packages}
    outs = np.zeros_like(pages)
    cpu: dict[str, list[float]] = {p: [] for p in packages}
    for rep in range(repeats + 1):
        for p in packages:
            a, b = socket.socketpair()
            child = multiprocessing.get_context("fork").Process(target=writer, args=(b, replies))
            child.start()
            b.close()
            a.settimeout(30.0)  # as redis-py's sockets
            reader = clients[p].ReplyReader(a)
            c0 = time.process_time()
            got = [modules[p].receive(reader, fp, k, o) for k, o in zip(keys, outs, strict=True)]
            used = time.process_time() - c0
            child.join()
            a.close()
            if not all(g.value == "hit" for g in got) or not np.array_equal(outs, pages):
                raise SystemExit(f"{p}: a value was not read back whole")
            outs[:] = 0
            if rep:
                cpu[p].append(used / count * 1e6)
    print(f"{size} B values, {count} per pass, load average {os.getloadavg()}")
    for p, runs in cpu.items():
        print(
            f"{p:12} CPU us per value: median {statistics.median(runs):.1f} "
            f"{[round(r, 1) for r in runs]}"
        )


if __name__ == "__main__":
    main()
