"""The client's CPU per loaded value, without the kernel: kvtier's reply reader against a
minimal reader, over an in-memory socket; and the checksum's cost against a copy.

Run from the repository root: ``PYTHONPATH=src python benchmarks/remote_value_cost.py
<repeats> [value bytes] [package ...]`` (each ``package`` a kvtier tree on the path,
e.g. ``kvtier_base`` as in ``remote_client_ab.py``; default ``kvtier``). 256 values of
``header || payload`` are framed as ``GET`` replies in memory; a fake socket hands them
out as fast as Python can copy them (every ``recv`` fills what it is given), so what is
timed is Python and memory, not system calls. Passes alternate after one warm-up round;
medians of this process's CPU per value:

* ``<package>``: ``remote_values.receive`` (line, header, payload and CRLF read, header
  compared with the one kvtier writes for the bytes read: one XXH3-64 of the payload);
* ``minimal``: one ``recvmsg_into`` loop into the reply line with the header, the page
  and the CRLF; nothing checked;
* ``minimal+header``: the same, then ``block_format.encode_header`` of the page (the
  checksum and the header, as kvtier's check computes them).

Then, by ``timeit`` (best of 5): XXH3-64 of a page in cache and of one of 256 pages
(64 MiB at 256 KiB: out of the caches), and a copy of such a page.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from kvtier.media import block_format

COUNT = 256
FINGERPRINT = b"\x05" * 32


class MemorySocket:
    """``recv_into`` and ``recvmsg_into`` over bytes in memory, each filling all it is given."""

    def __init__(self, data: bytes) -> None:
        self._view, self._at = memoryview(data), 0

    def recvmsg_into(self, buffers: list[Any]) -> tuple[int, list[Any], int, None]:
        got = 0
        for b in buffers:
            n = min(len(b), len(self._view) - self._at)
            b[:n] = self._view[self._at : self._at + n]
            self._at, got = self._at + n, got + n
            if n < len(b):
                break
        return got, [], 0, None

    def recv_into(self, buffer: Any) -> int:
        return self.recvmsg_into([buffer])[0]


def minimal(replies: bytes, keys: list[bytes], outs: np.ndarray, header: bool) -> None:
    sock = MemorySocket(replies)
    size = block_format.header_size(len(keys[0]), len(FINGERPRINT))
    head = bytearray(len(b"$%d\r\n" % (size + outs.shape[1])) + size)
    crlf = bytearray(2)
    for key, out in zip(keys, outs, strict=True):
        bufs = [memoryview(head), memoryview(out), memoryview(crlf)]
        i = 0
        while i < 3:
            got = sock.recvmsg_into(bufs[i:])[0]
            while i < 3 and got >= len(bufs[i]):
                got -= len(bufs[i])
                i += 1
            if got:
                bufs[i] = bufs[i][got:]
        if header:
            block_format.encode_header(key, FINGERPRINT, out.data)


def kvtier_reader(package: str, replies: bytes, keys: list[bytes], outs: np.ndarray) -> None:
    values = importlib.import_module(f"{package}.media.remote_values")
    client = importlib.import_module(f"{package}.media.redis_client")
    reader = client.ReplyReader(MemorySocket(replies))
    for key, out in zip(keys, outs, strict=True):
        if values.receive(reader, FINGERPRINT, key, out).value != "hit":
            raise SystemExit(f"{package}: a value was not verified")


def main() -> None:
    repeats = int(sys.argv[1])
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 10
    packages = sys.argv[3:] or ["kvtier"]
    keys = [i.to_bytes(32, "big") for i in range(COUNT)]
    pages = np.random.default_rng(0).integers(0, 256, (COUNT, size), dtype=np.uint8)
    hsize = block_format.header_size(32, len(FINGERPRINT))
    replies = b"".join(
        b"$%d\r\n" % (hsize + size)
        + block_format.encode_header(k, FINGERPRINT, p.data)
        + p.tobytes()
        + b"\r\n"
        for k, p in zip(keys, pages, strict=True)
    )
    outs = np.zeros_like(pages)
    passes: dict[str, Callable[[], None]] = {
        p: lambda p=p: kvtier_reader(p, replies, keys, outs)  # type: ignore[misc]
        for p in packages
    }
    passes["minimal"] = lambda: minimal(replies, keys, outs, header=False)
    passes["minimal+header"] = lambda: minimal(replies, keys, outs, header=True)
    cpu: dict[str, list[float]] = {name: [] for name in passes}
    for rep in range(repeats + 1):
        for name, run in passes.items():
            c0 = time.process_time()
            run()
            used = time.process_time() - c0
            if not np.array_equal(outs, pages):
                raise SystemExit(f"{name}: the pages do not hold the values")
            outs[:] = 0
            if rep:
                cpu[name].append(used / COUNT * 1e6)
    print(f"{size} B values, {COUNT} per pass, medians of {repeats}: CPU us per value")
    for name, runs in cpu.items():
        print(f"  {name:16} {statistics.median(runs):7.2f}  {[round(r, 2) for r in runs]}")
    cycle = iter(range(1 << 62))
    cold = {
        "XXH3-64, page in cache": lambda: xxhash.xxh3_64_intdigest(pages[0].data),
        "XXH3-64, page out of cache": lambda: xxhash.xxh3_64_intdigest(
            pages[next(cycle) % COUNT].data
        ),
        "copy, page out of cache": lambda: outs[0].__setitem__(
            slice(None), pages[next(cycle) % COUNT]
        ),
    }
    for name, fn in cold.items():
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000
        print(f"  {name:28} {best * 1e6:6.2f} us ({size / best / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
