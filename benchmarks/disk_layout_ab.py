"""One file per block (today's ``DiskStore``) against one segment file, and ``dd``, in one run.

Run from the repository root: ``PYTHONPATH=src python benchmarks/disk_layout_ab.py
[--dir D] [--sizes 256KiB,1MiB,4MiB] [--total 64MiB] [--repeats 5] [--threads 4]
[--json PATH]``.

The question it answers: would grouping blocks into segment files (issue 15) bring the
disk rows of ``kvtier bench disk`` to 0.8 of ``dd``, on this machine, before anyone
builds the index and the crash-safety machinery such a store needs? So the "segment"
side is the I/O pattern of that design and nothing more: one file preallocated with
``posix_fallocate``, fixed slots of ``block_file_size(block)`` bytes (the same 4 KiB
header region + payload a block file holds, header encoded and payload checksummed and
verified with ``kvtier.media.block_format`` as the store does), one ``pwritev`` /
``preadv`` per block at the slot's offset, ``--threads`` blocks in flight. Slots are
overwritten pass after pass (a cache's steady state). The "files" side is the real
``DiskStore`` (``write`` / ``read_into``, the same thread count); its stores run as a
full cache's: each block of a pass evicts one of the previous pass, either deleting it
first ("files-delete", the handler before the file reuse) or handing it to ``write``
to take over its file ("files-reuse"). ``dd`` is run exactly as ``kvtier bench disk`` runs it.

Rows: store direct (``O_DIRECT``, no fsync), load direct, load buffered (cold: the
benchmark's own files are evicted from the page cache before each pass with
``kvtier.bench.disk.evict_own_files``, nothing else is touched). Passes alternate
files, segment, dd; medians over ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kvtier import options
from kvtier.bench.disk import evict_own_files
from kvtier.media import block_format
from kvtier.media.direct_io import O_DIRECT, aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import HEADER_REGION, block_file_size
from kvtier.results import write_result

FINGERPRINT = b"layout-ab-fingerprint-0123456789"


class Segment:
    """The I/O of a segment-file store: fixed slots in one preallocated file."""

    def __init__(self, path: Path, block: int, count: int) -> None:
        self.path, self.block, self.count = path, block, count
        self.slot = block_file_size(block)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.slot * count)
        finally:
            os.close(fd)

    def write_all(self, pages: np.ndarray, threads: int) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | O_DIRECT)
        regions = [aligned_empty(HEADER_REGION) for _ in range(self.count)]

        def one(i: int) -> None:
            key = i.to_bytes(8, "little") * 4
            header = block_format.encode_header(key, FINGERPRINT, pages[i].data)
            region = regions[i]
            region[: len(header)] = np.frombuffer(header, dtype=np.uint8)
            region[len(header) :] = 0
            assert os.pwritev(fd, [region, pages[i]], i * self.slot) == self.slot

        try:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(self.count)))
        finally:
            os.close(fd)

    def read_all(self, pages: np.ndarray, threads: int, direct: bool) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | (O_DIRECT if direct else 0))
        regions = [aligned_empty(HEADER_REGION) for _ in range(self.count)]

        def one(i: int) -> None:
            key = i.to_bytes(8, "little") * 4
            assert os.preadv(fd, [regions[i], pages[i]], i * self.slot) == self.slot
            block_format.verify(regions[i].data, pages[i].data, key=key, fingerprint=FINGERPRINT)

        try:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(self.count)))
        finally:
            os.close(fd)


class Files:
    """The real ``DiskStore``: one file per block."""

    def __init__(self, root: Path, block: int, count: int, direct: bool) -> None:
        cap = 2 * count * block_file_size(block)
        self.store = DiskStore.open(root, FINGERPRINT, cap, direct_io=direct)
        self.count, self.generation = count, 0
        self.keys: list[bytes] = []
        self.previous: list[bytes] = []

    def fresh_keys(self) -> None:
        """The next pass stores new keys, each evicting one of the last pass."""
        self.generation += 1
        g = self.generation
        self.previous = self.keys
        self.keys = [f"{g}/{i}".encode().ljust(32, b".") for i in range(self.count)]

    def write_all(self, pages: np.ndarray, threads: int, reuse: bool) -> None:
        """``reuse``: ``write(key, evict=[victim])`` (this commit); otherwise
        ``delete(victim)`` then ``write(key)``, what the handler did before it."""
        keys, previous = self.keys, self.previous

        def one(i: int) -> None:
            victims = previous[i : i + 1]
            if reuse:
                self.store.write(keys[i], pages[i], evict=victims)
            else:
                for v in victims:
                    self.store.delete(v)
                self.store.write(keys[i], pages[i])

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(self.count)))

    def read_all(self, pages: np.ndarray, threads: int) -> None:
        with ThreadPoolExecutor(threads) as pool:
            keys = self.keys
            list(pool.map(lambda i: self.store.read_into(keys[i], pages[i]), range(self.count)))


def medians(
    runs: dict[str, tuple[Callable[[], object], Callable[[], object]]], repeats: int
) -> dict[str, float]:
    """Median seconds of each ``(setup, run)``, round robin, after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats + 1):
        for name, (setup, run) in runs.items():
            setup()
            t0 = time.perf_counter()
            run()
            if i:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def _dd(args: list[str]) -> None:
    subprocess.run(["dd", *args, "status=none"], check=True)


def one_size(root: Path, block: int, total: int, repeats: int, threads: int) -> list[dict]:
    count = max(1, total // block)
    pages = aligned_empty(count * block).reshape(count, block)
    pages[:] = np.random.default_rng(0).integers(0, 256, (count, block), dtype=np.uint8)
    rows = []
    for direct in (True, False):
        rows.extend(one_mode(root, block, pages, direct, repeats, threads))
    return rows


def one_mode(
    root: Path, block: int, pages: np.ndarray, direct: bool, repeats: int, threads: int
) -> list[dict]:
    """Store (direct only) and load rows for one block size and one mode."""
    count = pages.shape[0]
    ddfile = root / "dd.bin"
    dd_w = ["if=/dev/zero", f"of={ddfile}", f"bs={block}", f"count={count}"]
    sub = root / ("direct" if direct else "buffered")
    sub.mkdir()
    files = Files(sub / "files", block, count, direct)
    seg = Segment(sub / "segment.kvs", block, count)
    seg.write_all(pages, threads)
    rows = []
    if direct:  # store direct; the last timed pass leaves what the loads read
        t = medians(
            {
                "files-delete": (files.fresh_keys, lambda: files.write_all(pages, threads, False)),
                "files-reuse": (files.fresh_keys, lambda: files.write_all(pages, threads, True)),
                "segment": (lambda: None, lambda: seg.write_all(pages, threads)),
                "dd": (
                    lambda: ddfile.unlink(missing_ok=True),
                    lambda: _dd([*dd_w, "oflag=direct"]),
                ),
            },
            repeats,
        )
        rows.append(_row("store", "direct", block, count, t, "oflag=direct"))
    else:
        files.fresh_keys()
        files.write_all(pages, threads, True)
        _dd(dd_w)
    cold: Callable[[], object] = (lambda: None) if direct else (lambda: evict_own_files(root))
    dd_r = [f"if={ddfile}", "of=/dev/null", f"bs={block}", *(["iflag=direct"] * direct)]
    t = medians(
        {
            "files": (cold, lambda: files.read_all(pages, threads)),
            "segment": (cold, lambda: seg.read_all(pages, threads, direct)),
            "dd": (cold, lambda: _dd(dd_r)),
        },
        repeats,
    )
    mode = "direct" if direct else "buffered"
    rows.append(_row("load", mode, block, count, t, "iflag=direct" if direct else "(none)"))
    files.store.close()
    shutil.rmtree(sub)
    ddfile.unlink(missing_ok=True)
    return rows


def _row(op: str, mode: str, block: int, count: int, t: dict[str, float], flags: str) -> dict:
    gbps = {name: block * count / s / 1e9 for name, s in t.items()}
    return {
        "op": op,
        "mode": mode,
        "block_bytes": block,
        "blocks": count,
        "gbps": {name: round(v, 3) for name, v in gbps.items()},
        "ratio_to_dd": {name: round(v / gbps["dd"], 3) for name, v in gbps.items()},
        "dd_flags": flags,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path.cwd())
    p.add_argument("--sizes", type=options.size_list, default="256KiB,1MiB,4MiB")
    p.add_argument("--total", type=options.size, default="64MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix=".kvtier-layout-ab-", dir=a.dir))
    try:
        rows = [r for s in a.sizes for r in one_size(root, s, a.total, a.repeats, a.threads)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        ratios = "  ".join(f"{k} {v:.2f}" for k, v in r["ratio_to_dd"].items() if k != "dd")
        print(
            f"{r['op']:5} {r['mode']:9} {r['block_bytes'] // 1024:>5}Ki "
            f"dd {r['gbps']['dd']:.3f} GB/s; ratios to dd: {ratios}"
        )
    config = {
        "dir": str(a.dir),
        "sizes": a.sizes,
        "total_bytes_per_pass": a.total,
        "repeats": a.repeats,
        "threads": a.threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    if a.json:
        print("wrote", write_result("disk-layout-ab", config, rows, a.json))


if __name__ == "__main__":
    main()
