"""Segment store, coalesced against one block per system call, and ``dd``, in one run.

Run from the repository root: ``PYTHONPATH=src python benchmarks/disk_layout_ab.py
[--dir D] [--sizes 256KiB,1MiB,4MiB] [--total 64MiB] [--repeats 5] [--threads 4]
[--job-blocks 16] [--json PATH]``.

The question it answers (issue 15): does storing a job's blocks in consecutive slots
and reading consecutive slots with one ``preadv`` (what ``DiskStore`` does) bring the
disk rows to ``dd``'s, and how much of that is the coalescing? Both sides are the real
``DiskStore`` in segment files, in one directory, with the same thread count:

* ``runs``: the real CPU<->disk handlers, jobs of ``--job-blocks`` blocks (stores
  write each job's stretch with one ``pwritev``, loads read each run of consecutive
  slots with one ``preadv``);
* ``per-block``: the same store driven one block per call (``write`` / ``read_into``
  on a thread pool), the I/O pattern of the file-per-block layout this replaced;
* ``raw`` (cold buffered loads only): the same number of payload bytes read from the ``runs``
  side's segment file straight into the same pages, 4 MiB per ``preadv``, on a pool
  of the same size, with no store, no header and no checksum: the floor for reading
  those bytes into that destination from Python.

Stores run as a full cache's: each pass stores fresh keys, evicting the previous
pass's. ``dd`` is run as ``kvtier bench disk`` runs it. Rows: store direct, load direct,
load buffered (cold: the benchmark's own files are evicted from the page cache before
each pass with ``kvtier.bench.disk.evict_own_files``, nothing else is touched). Passes
alternate runs, per-block, dd; medians over ``--repeats`` after one warm-up. For loads
it also records, from the block device's ``stat``, the mean size of the read requests
the device completed during each side's passes (another process's reads on the same
device would count too): the kernel's view of how sequential the reads were; and
for every side the CPU seconds per GB the pass cost (this process's, or ``dd``'s),
which a loaded machine's scheduling noise does not change the way it changes time.
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
import torch
from disk_probes import cpu_seconds, device_reads

from kvtier import options
from kvtier.bench.disk import evict_own_files
from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.results import write_result
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

FINGERPRINT = b"layout-ab-fingerprint-0123456789"


class Side:
    """One store and the keys of its last pass."""

    def __init__(self, root: Path, pages: torch.Tensor, direct: bool, threads: int) -> None:
        count, block = pages.shape
        cap = 2 * count * block_file_size(block)
        self.store = DiskStore.open(root, FINGERPRINT, cap, direct_io=direct)
        self.handlers = CpuDiskOffloadingHandlers(pages, self.store, io_threads=threads)
        self.pages = pages.numpy()
        self.rows = [self.pages[i] for i in range(count)]
        self.count, self.threads, self.generation, self.job = count, threads, 0, 0
        self.keys: list[bytes] = []
        self.previous: list[bytes] = []

    def fresh_keys(self) -> None:
        """The next pass stores new keys, evicting the last pass's."""
        self.generation += 1
        self.previous = self.keys
        g = self.generation
        self.keys = [f"{g}/{i}".encode().ljust(32, b".") for i in range(self.count)]

    def by_jobs(self, store: bool, job_blocks: int) -> None:
        """Through the handlers, jobs of ``job_blocks`` blocks."""
        handler = self.handlers.cpu_to_disk_handler if store else self.handlers.disk_to_cpu_handler
        jobs = []
        for start in range(0, self.count, job_blocks):
            ids = tuple(BlockId(i) for i in range(start, min(start + job_blocks, self.count)))
            keys = tuple(BlockHash(self.keys[i]) for i in ids)
            gone = tuple(BlockHash(self.previous[i]) for i in ids if i < len(self.previous))
            cpu = CPULoadStoreSpec(ids)
            disk = DiskLoadStoreSpec(ids, keys, gone if store else ())
            self.job += 1
            handler.transfer_async(self.job, (cpu, disk) if store else (disk, cpu))
            jobs.append(self.job)
        handler.wait(jobs)
        failed = [r for r in handler.get_finished() if not r.success]
        assert not failed, failed[0].error

    def per_block(self, store: bool) -> None:
        """One ``write`` / ``read_into`` per block on a pool of the same size."""
        keys, previous = self.keys, self.previous

        def one(i: int) -> None:
            if store:
                self.store.write(keys[i], self.rows[i], evict=previous[i : i + 1])
            else:
                self.store.read_into(keys[i], self.rows[i])

        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(one, range(self.count)))

    def raw(self) -> None:
        """Payload bytes of the segment file straight into the pages (the floor)."""
        (segment,) = self.store.directory.glob("*.seg")
        dest = self.pages.reshape(-1)
        chunk = 4 << 20
        fd = os.open(segment, os.O_RDONLY)
        try:
            with ThreadPoolExecutor(self.threads) as pool:
                offsets = range(0, dest.nbytes, chunk)
                list(pool.map(lambda o: os.preadv(fd, [dest[o : o + chunk]], o), offsets))
        finally:
            os.close(fd)

    def close(self) -> None:
        self.handlers.shutdown()
        self.store.close()


def medians(
    runs: dict[str, tuple[Callable[[], object], Callable[[], object]]],
    repeats: int,
    where: Path,
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Median seconds of each ``(setup, run)``, round robin, after one warm-up round;
    the mean KiB per read request the device completed during each side's runs; and
    the median CPU seconds of each side's runs."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    reads = dict.fromkeys(runs, (0, 0))
    for i in range(repeats + 1):
        for name, (setup, run) in runs.items():
            setup()
            before = device_reads(where)
            c0, t0 = cpu_seconds(), time.perf_counter()
            run()
            if i:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_seconds() - c0)
                after = device_reads(where)
                r, sec = reads[name]
                reads[name] = (r + after[0] - before[0], sec + after[1] - before[1])
    kib = {n: round(sec * 512 / 1024 / r, 1) if r else 0.0 for n, (r, sec) in reads.items()}
    seconds = {name: statistics.median(t) for name, t in times.items()}
    return seconds, kib, {name: statistics.median(c) for name, c in cpu.items()}


def _dd(args: list[str]) -> None:
    subprocess.run(["dd", *args, "status=none"], check=True)


def one_size(
    root: Path, block: int, total: int, repeats: int, threads: int, job_blocks: int
) -> list[dict]:
    count = max(1, total // block)
    pages = torch.frombuffer(aligned_empty(count * block), dtype=torch.uint8).view(count, block)
    rng = np.random.default_rng(0)
    pages.copy_(torch.from_numpy(rng.integers(0, 256, (count, block), dtype=np.uint8)))
    rows = []
    for direct in (True, False):
        rows.extend(one_mode(root, block, pages, direct, repeats, threads, job_blocks))
    return rows


def one_mode(
    root: Path,
    block: int,
    pages: torch.Tensor,
    direct: bool,
    repeats: int,
    threads: int,
    job_blocks: int,
) -> list[dict]:
    """Store (direct only) and load rows for one block size and one mode."""
    count = pages.shape[0]
    ddfile = root / "dd.bin"
    dd_w = ["if=/dev/zero", f"of={ddfile}", f"bs={block}", f"count={count}"]
    sub = root / ("direct" if direct else "buffered")
    sub.mkdir()
    runs, single = (
        Side(sub / "runs", pages, direct, threads),
        Side(sub / "one", pages, direct, threads),
    )
    rows = []
    if direct:  # store direct; the last timed pass leaves what the loads read
        t, _, cpu = medians(
            {
                "runs": (runs.fresh_keys, lambda: runs.by_jobs(True, job_blocks)),
                "per-block": (single.fresh_keys, lambda: single.per_block(True)),
                "dd": (
                    lambda: ddfile.unlink(missing_ok=True),
                    lambda: _dd([*dd_w, "oflag=direct"]),
                ),
            },
            repeats,
            root,
        )
        rows.append(_row("store", "direct", block, count, t, {}, cpu, "oflag=direct"))
    else:
        for side in (runs, single):
            side.fresh_keys()
            side.by_jobs(True, job_blocks)
        _dd(dd_w)
    cold: Callable[[], object] = (lambda: None) if direct else (lambda: evict_own_files(root))
    dd_r = [f"if={ddfile}", "of=/dev/null", f"bs={block}", *(["iflag=direct"] * direct)]
    t, kib, cpu = medians(
        {
            "runs": (cold, lambda: runs.by_jobs(False, job_blocks)),
            "per-block": (cold, lambda: single.per_block(False)),
            "dd": (cold, lambda: _dd(dd_r)),
            **({} if direct else {"raw": (cold, runs.raw)}),
        },
        repeats,
        root,
    )
    mode = "direct" if direct else "buffered"
    flags = "iflag=direct" if direct else "(none)"
    rows.append(_row("load", mode, block, count, t, kib, cpu, flags))
    runs.close()
    single.close()
    shutil.rmtree(sub)
    ddfile.unlink(missing_ok=True)
    return rows


def _row(
    op: str,
    mode: str,
    block: int,
    count: int,
    t: dict[str, float],
    kib: dict,
    cpu: dict[str, float],
    flags: str,
) -> dict:
    gbps = {name: block * count / s / 1e9 for name, s in t.items()}
    return {
        "op": op,
        "mode": mode,
        "block_bytes": block,
        "blocks": count,
        "gbps": {name: round(v, 3) for name, v in gbps.items()},
        "ratio_to_dd": {name: round(v / gbps["dd"], 3) for name, v in gbps.items()},
        "kib_per_device_read": kib,
        "cpu_s_per_gb": {name: round(c / (block * count / 1e9), 3) for name, c in cpu.items()},
        "dd_flags": flags,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path.cwd())
    p.add_argument("--sizes", type=options.size_list, default="256KiB,1MiB,4MiB")
    p.add_argument("--total", type=options.size, default="64MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--job-blocks", type=int, default=16)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix=".kvtier-layout-ab-", dir=a.dir))
    try:
        rows = [
            r
            for s in a.sizes
            for r in one_size(root, s, a.total, a.repeats, a.threads, a.job_blocks)
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        ratios = "  ".join(f"{k} {v:.2f}" for k, v in r["ratio_to_dd"].items() if k != "dd")
        sizes = "  ".join(f"{k} {v}" for k, v in r["kib_per_device_read"].items())
        cpu = "  ".join(f"{k} {v:.2f}" for k, v in r["cpu_s_per_gb"].items())
        print(
            f"{r['op']:5} {r['mode']:9} {r['block_bytes'] // 1024:>5}Ki "
            f"dd {r['gbps']['dd']:.3f} GB/s; ratios to dd: {ratios}; CPU s/GB: {cpu}"
            + (f"; KiB per device read: {sizes}" if sizes else "")
        )
    config = {
        "dir": str(a.dir),
        "sizes": a.sizes,
        "total_bytes_per_pass": a.total,
        "repeats": a.repeats,
        "threads": a.threads,
        "job_blocks": a.job_blocks,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    if a.json:
        print("wrote", write_result("disk-layout-ab", config, rows, a.json))


if __name__ == "__main__":
    main()
