"""Cold buffered loads: kvtier against bare reads of the same bytes, in two orders, and ``dd``.

Run from the repository root: ``PYTHONPATH=src python benchmarks/disk_cold_ab.py
[--dir D] [--sizes 256KiB,1MiB,4MiB] [--total 32MiB] [--repeats 7] [--threads 4,1]
[--job-blocks 16] [--json PATH]``.

The question it answers (issue 15): why do kvtier's cold buffered loads stay below
0.8 of ``dd`` reading the same bytes, and what is the floor? One ``DiskStore`` opened
with ``direct_io=False`` holds ``--total`` bytes of blocks in consecutive slots (as a
store job leaves them); before every pass the benchmark evicts its own files from the
page cache (``kvtier.bench.disk.evict_own_files``). Sides, each at every thread count
of ``--threads``:

* ``kvtier@T``: the real disk->CPU handler with ``T`` I/O threads, jobs of
  ``--job-blocks`` blocks submitted in slot order (what ``kvtier bench disk`` does);
* ``raw@T``: the same runs (``DiskStore.runs`` of each job: header regions and
  payloads of consecutive slots) read with one bare ``preadv`` each into the same
  pages, on ``T`` threads sharing one descriptor, in the same order, with no store,
  no verification and no handler: the floor for that I/O pattern from Python;
* ``kvtier@T shuffled`` and ``raw@T shuffled``: the same with the jobs (runs) in a
  random order, which is what an engine's loads look like when the jobs are not
  neighbours on disk (``dd`` has no such case);
* ``dd``: ``dd bs=<block size>`` of a file of the same size in the same directory.

Per side: median GB/s and ratio to ``dd``, median CPU seconds per GB (this process's,
or ``dd``'s), and the mean size of the read requests the block device completed
(another process reading the same device would count too). The CPU and request size
say how the kernel served the reads, which a loaded machine's scheduling noise does
not change the way it changes time.
"""

from __future__ import annotations

import argparse
import os
import random
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
from kvtier.media.disk_layout import HEADER_REGION, block_file_size
from kvtier.results import write_result
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

FINGERPRINT = b"cold-ab-fingerprint-0123456789.."


class Fixture:
    """One store of ``count`` blocks in consecutive slots, its pages and its jobs."""

    def __init__(self, root: Path, pages: torch.Tensor, job_blocks: int) -> None:
        count, block = pages.shape
        self.root, self.block, self.count = root, block, count
        self.store = DiskStore.open(
            root / "kvtier", FINGERPRINT, 2 * count * block_file_size(block), direct_io=False
        )
        self.pages = pages
        self.rows = pages.numpy()
        self.keys = [f"{i}".encode().ljust(32, b".") for i in range(count)]
        starts = range(0, count, job_blocks)
        self.jobs = [list(range(s, min(s + job_blocks, count))) for s in starts]
        for job in self.jobs:  # one store job each: consecutive slots
            self.store.write_blocks([self.keys[i] for i in job], [self.rows[i] for i in job])
        self.handlers: dict[int, CpuDiskOffloadingHandlers] = {}
        self.pools: dict[int, ThreadPoolExecutor] = {}  # raw's, kept like the handlers'
        self.job_id = 0

    def order(self, shuffled: bool) -> list[list[int]]:
        jobs = list(self.jobs)
        if shuffled:
            random.Random(len(jobs)).shuffle(jobs)
        return jobs

    def kvtier(self, threads: int, shuffled: bool) -> None:
        """Load every block through the handler, jobs in slot (or shuffled) order."""
        if threads not in self.handlers:
            self.handlers[threads] = CpuDiskOffloadingHandlers(
                self.pages, self.store, io_threads=threads
            )
        handler = self.handlers[threads].disk_to_cpu_handler
        ids = []
        for job in self.order(shuffled):
            cpu = CPULoadStoreSpec(tuple(BlockId(i) for i in job))
            disk = DiskLoadStoreSpec(
                tuple(BlockId(i) for i in job), tuple(BlockHash(self.keys[i]) for i in job)
            )
            self.job_id += 1
            handler.transfer_async(self.job_id, (disk, cpu))
            ids.append(self.job_id)
        handler.wait(ids)
        failed = [r for r in handler.get_finished() if not r.success]
        assert not failed, failed[0].error

    def raw(self, threads: int, shuffled: bool) -> None:
        """The same runs, one bare ``preadv`` each, nothing verified."""
        runs: list[tuple[int, list[int]]] = []
        for job in self.order(shuffled):
            for run in self.store.runs([self.keys[i] for i in job]):
                located = self.store.locate(self.keys[job[run[0]]])
                assert located is not None
                runs.append((located[1], [job[r] for r in run]))
        (segment,) = self.store.directory.glob("*.seg")
        fd = os.open(segment, os.O_RDONLY | os.O_CLOEXEC)

        def read(run: tuple[int, list[int]]) -> None:
            offset, blocks = run
            regions = aligned_empty(len(blocks) * HEADER_REGION).reshape(-1, HEADER_REGION)
            buffers: list[np.ndarray] = []
            for n, i in enumerate(blocks):
                buffers += [regions[n], self.rows[i]]
            os.preadv(fd, buffers, offset)

        pool = self.pools.setdefault(threads, ThreadPoolExecutor(threads))
        try:
            list(pool.map(read, runs))
        finally:
            os.close(fd)

    def close(self) -> None:
        for h in self.handlers.values():
            h.shutdown()
        for pool in self.pools.values():
            pool.shutdown()
        self.store.close()


def one_size(root: Path, block: int, a: argparse.Namespace) -> dict:
    count = max(1, a.total // block)
    pages = torch.frombuffer(aligned_empty(count * block), dtype=torch.uint8).view(count, block)
    pages.copy_(
        torch.from_numpy(np.random.default_rng(0).integers(0, 256, (count, block), np.uint8))
    )
    fx = Fixture(root, pages, a.job_blocks)
    ddfile = root / "dd.bin"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={ddfile}", f"bs={block}", f"count={count}", "status=none"],
        check=True,
    )
    sides: dict[str, Callable[[], object]] = {}
    for shuffled in (False, True):
        for t in a.threads:
            tag = " shuffled" if shuffled else ""
            sides[f"kvtier@{t}{tag}"] = lambda t=t, s=shuffled: fx.kvtier(t, s)
            sides[f"raw@{t}{tag}"] = lambda t=t, s=shuffled: fx.raw(t, s)
    dd = ["dd", f"if={ddfile}", "of=/dev/null", f"bs={block}", "status=none"]
    sides["dd"] = lambda: subprocess.run(dd, check=True)
    times: dict[str, list[float]] = {n: [] for n in sides}
    cpus: dict[str, list[float]] = {n: [] for n in sides}
    reads = dict.fromkeys(sides, (0, 0))
    for i in range(a.repeats + 1):  # round robin, one warm-up round
        for name, run in sides.items():
            evict_own_files(root)
            before = device_reads(root)
            c0, t0 = cpu_seconds(), time.perf_counter()
            run()
            if i:
                times[name].append(time.perf_counter() - t0)
                cpus[name].append(cpu_seconds() - c0)
                after = device_reads(root)
                r, sec = reads[name]
                reads[name] = (r + after[0] - before[0], sec + after[1] - before[1])
    fx.close()
    shutil.rmtree(root / "kvtier")
    ddfile.unlink()
    gb = count * block / 1e9
    gbps = {n: gb / statistics.median(t) for n, t in times.items()}
    return {
        "block_bytes": block,
        "blocks": count,
        "gbps": {n: round(v, 3) for n, v in gbps.items()},
        "ratio_to_dd": {n: round(v / gbps["dd"], 3) for n, v in gbps.items()},
        "cpu_s_per_gb": {n: round(statistics.median(c) / gb, 3) for n, c in cpus.items()},
        "kib_per_device_read": {
            n: round(sec * 512 / 1024 / r, 1) if r else 0.0 for n, (r, sec) in reads.items()
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path.cwd())
    p.add_argument("--sizes", type=options.size_list, default="256KiB,1MiB,4MiB")
    p.add_argument("--total", type=options.size, default="32MiB")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[4, 1])
    p.add_argument("--job-blocks", type=int, default=16)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix=".kvtier-cold-ab-", dir=a.dir))
    try:
        rows = [one_size(root, s, a) for s in a.sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        print(f"{r['block_bytes'] // 1024} KiB, dd {r['gbps']['dd']:.3f} GB/s")
        for name in r["gbps"]:
            print(
                f"  {name:22} ratio {r['ratio_to_dd'][name]:5.2f}  CPU s/GB "
                f"{r['cpu_s_per_gb'][name]:5.3f}  KiB per device read "
                f"{r['kib_per_device_read'][name]:7.1f}"
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
        print("wrote", write_result("disk-cold-ab", config, rows, a.json))


if __name__ == "__main__":
    main()
