"""How the kernel serves cold buffered reads of 4 MiB: in file order or not, 1 or 4 threads.

Run from the repository root: ``python benchmarks/disk_read_pattern.py [--dir D]
[--total 128MiB] [--repeats 5] [--json PATH]`` (needs no kvtier import but ``results``
for the JSON: ``PYTHONPATH=src``).

The question it answers (issue 15): ``dd`` reads a file at close to the disk's speed
through the page cache, kvtier's cold buffered loads (4 MiB ``preadv`` of runs of
slots, on 4 threads) do not, and a bare ``preadv`` of the same runs on the same threads
does no better (``disk_cold_ab.py``). Is the difference the access pattern? One file of
``--total`` random bytes, evicted from the page cache before each pass
(``POSIX_FADV_DONTNEED`` on that file only), read into page-aligned memory by:

* ``seq@1`` / ``seq@4``: 4 MiB ``preadv`` in file order, 1 or 4 threads, one descriptor;
* ``shuffled@1`` / ``shuffled@4``: the same reads in a random order;
* ``slots@1`` / ``slots@4``: kvtier's slot layout, a 4 KiB header region and a 4 MiB
  payload per slot, slots back to back, in file order;
* ``dd``: ``dd bs=4M``.

Per side: median GB/s, CPU seconds per GB (this process's or ``dd``'s, kernel time
included, which is most of it) and the mean size of the read requests the block device
completed. The device's own limits are recorded too (``max_segments``,
``max_sectors_kb``, ``read_ahead_kb``).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from disk_probes import cpu_seconds, device_reads

from kvtier import options
from kvtier.results import write_result

CHUNK = 4 << 20
HEADER = 4096


def queue_limits(path: Path) -> dict[str, str]:
    """The block device's request limits, where sysfs shows them."""
    dev = os.stat(path).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    queue = base / "queue" if (base / "queue").exists() else base / ".." / "queue"
    out = {}
    for name in ("max_segments", "max_sectors_kb", "read_ahead_kb", "max_segment_size"):
        try:
            out[name] = (queue / name).read_text().strip()
        except OSError:
            out[name] = "unknown"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path.cwd())
    p.add_argument("--total", type=options.size, default="128MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    total = a.total // CHUNK * CHUNK
    path = a.dir / f".kvtier-read-pattern-{os.getpid()}.bin"
    load_before = os.getloadavg()
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, total, dtype=np.uint8).tobytes())
        os.fsync(f.fileno())
    dest = np.frombuffer(mmap.mmap(-1, total), dtype=np.uint8)
    dest[:] = 1  # touched: no page faults inside the timed reads
    pools = {1: ThreadPoolExecutor(1), 4: ThreadPoolExecutor(4)}
    offsets = list(range(0, total, CHUNK))
    slots = (total - HEADER) // (CHUNK + HEADER)

    def chunks(threads: int, shuffled: bool) -> None:
        order = list(offsets)
        if shuffled:
            random.Random(1).shuffle(order)
        fd = os.open(path, os.O_RDONLY)
        try:
            list(pools[threads].map(lambda o: os.preadv(fd, [dest[o : o + CHUNK]], o), order))
        finally:
            os.close(fd)

    def slotted(threads: int) -> None:
        fd = os.open(path, os.O_RDONLY)

        def one(k: int) -> None:
            header = np.empty(HEADER, np.uint8)
            os.preadv(fd, [header, dest[k * CHUNK : (k + 1) * CHUNK]], k * (CHUNK + HEADER))

        try:
            list(pools[threads].map(one, range(slots)))
        finally:
            os.close(fd)

    dd = ["dd", f"if={path}", "of=/dev/null", f"bs={CHUNK}", "status=none"]
    sides: dict[str, tuple[Callable[[], object], int]] = {
        "seq@1": (lambda: chunks(1, False), total),
        "shuffled@1": (lambda: chunks(1, True), total),
        "slots@1": (lambda: slotted(1), slots * CHUNK),
        "seq@4": (lambda: chunks(4, False), total),
        "shuffled@4": (lambda: chunks(4, True), total),
        "slots@4": (lambda: slotted(4), slots * CHUNK),
        "dd": (lambda: subprocess.run(dd, check=True), total),
    }
    got: dict[str, list[tuple[float, float, float]]] = {n: [] for n in sides}
    try:
        for i in range(a.repeats + 1):
            for name, (run, _) in sides.items():
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
                r0, c0, t0 = device_reads(path), cpu_seconds(), time.perf_counter()
                run()
                t, c, r1 = time.perf_counter() - t0, cpu_seconds() - c0, device_reads(path)
                if i:
                    kib = (r1[1] - r0[1]) * 512 / 1024 / max(1, r1[0] - r0[0])
                    got[name].append((t, c, kib))
    finally:
        path.unlink(missing_ok=True)
    rows = []
    for name, runs in got.items():
        gb = sides[name][1] / 1e9
        row = {
            "side": name,
            "gbps": round(gb / statistics.median(r[0] for r in runs), 3),
            "cpu_s_per_gb": round(statistics.median(r[1] for r in runs) / gb, 3),
            "kib_per_device_read": round(statistics.median(r[2] for r in runs), 1),
        }
        rows.append(row)
        print(
            f"{name:11} {row['gbps']:6.2f} GB/s  CPU {row['cpu_s_per_gb']:.3f} s/GB  "
            f"{row['kib_per_device_read']:7.1f} KiB per device read"
        )
    config = {
        "dir": str(a.dir),
        "total_bytes": total,
        "repeats": a.repeats,
        "read_bytes": CHUNK,
        "device": queue_limits(a.dir),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    print(config["device"])
    if a.json:
        print("wrote", write_result("disk-read-pattern", config, rows, a.json))


if __name__ == "__main__":
    main()
