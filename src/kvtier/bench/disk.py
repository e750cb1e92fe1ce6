"""``kvtier bench disk``: store and load GB/s of the disk tier against ``dd``, side by side.

For each block size, ``--total`` bytes are stored as that many blocks through the
CPU->disk handler (``--io-threads`` blocks in flight, jobs of ``--job-blocks``) and
loaded back through the disk->CPU handler, and ``dd`` moves the same bytes with the
same block size to and from one file in the same directory, in the same run. Each
kvtier mode is compared with the ``dd`` flags that do the same work::

    op     mode            kvtier (DiskStore)                 dd (one file, same bs)
    store  direct          O_DIRECT, no fsync                 oflag=direct
    store  direct+sync     O_DIRECT, fdatasync per stretch    oflag=direct,dsync
    store  buffered+sync   page cache, fdatasync per stretch  oflag=dsync
    load   direct          O_DIRECT                           iflag=direct
    load   buffered        page cache, cold when dropped      (no flag), cold when dropped

Sealing's cost (``--sealed-sizes``, ``kvtier.bench.sealed``): in the same run, direct
stores and loads (the fastest mode, where sealing is the largest share) through a
plain store and a store sealed with a random key, alternated.

A buffered store without fsync only measures copies into the page cache, so it is not
compared. Each store pass stores fresh blocks into a full cache, as an engine's disk
tier does once it has filled: the store job names, per block, one block of the
previous pass as evicted (``DiskLoadStoreSpec.evicted_hashes``, as the scheduler's
index sends them), so the store reuses those slots (see ``DiskStore.write_blocks``); the
warm-up pass fills the cache. kvtier and ``dd`` passes alternate (kvtier, dd, kvtier,
...) so that drift of a shared or virtual disk hits both alike.

``dd`` reads ``/dev/zero`` (free) while kvtier also checksums every block and writes
an index record per block: the ratio is the whole cost of the design.
Before each cold pass the benchmark evicts its own files, and only those, from the
page cache (``fdatasync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file it
wrote); the rest of the machine's cache is never touched. Reported: median GB/s (10^9 bytes
per second of payload) over ``--repeats`` passes after one warm-up pass.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvtier import options
from kvtier.bench import sealed
from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.machine import check_disk
from kvtier.media import block_format
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
from kvtier.worker.handler import OffloadingHandler

STORE_MODES = {  # mode -> (direct_io, fsync, dd flags)
    "direct": (True, False, ["oflag=direct"]),
    "direct+sync": (True, True, ["oflag=direct,dsync"]),
    "buffered+sync": (False, True, ["oflag=dsync"]),
}
LOAD_MODES = {"direct": (True, ["iflag=direct"]), "buffered": (False, [])}
LOAD_AFTER = {"direct": "direct", "buffered+sync": "buffered"}  # loads read those blocks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench disk`` (each checked before anything is measured)."""
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="existing writable directory to test (default: the current directory); "
        "the benchmark works in a temporary directory inside it and removes it",
    )
    parser.add_argument(
        "--sizes",
        type=options.size_list,
        default="256KiB,1MiB,4MiB",
        help="block sizes, comma separated",
    )
    parser.add_argument(
        "--total",
        type=options.size,
        default="64MiB",
        help="bytes moved per pass (bounds the disk space used)",
    )
    parser.add_argument(
        "--repeats", type=options.positive, default=5, help="timed passes per measurement"
    )
    parser.add_argument(
        "--io-threads", type=options.positive, default=4, help="blocks in flight per direction"
    )
    parser.add_argument("--job-blocks", type=options.positive, default=16, help="blocks per job")
    parser.add_argument(
        "--sealed-sizes",
        type=options.size_list,
        default=sealed.DEFAULT_SIZES,
        help="block sizes whose direct stores and loads also run sealed (AES-256-GCM) "
        "beside plain ones",
    )
    add_json_option(parser, "disk")
    parser.epilog = (
        "Cold loads: before each, the benchmark evicts only its own files from the page "
        "cache (posix_fadvise DONTNEED on each file it wrote); it never drops the "
        "machine's cache."
    )


def evict_own_files(root: Path) -> bool:
    """Evict every file under ``root`` (the benchmark's own) from the page cache.

    Each file is written back (``fdatasync``) and its pages dropped with
    ``posix_fadvise(POSIX_FADV_DONTNEED)``; no other file on the machine is touched.
    Directory entries and inodes stay cached, as they do on a running server.
    Returns ``False`` where the platform has no ``posix_fadvise``.
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def checksum_vs_copy(sizes: list[int], repeats: int = 9) -> list[dict[str, Any]]:
    """GB/s of the block checksum (``block_format.payload_checksum``) and of a copy of
    the same buffer, per size: what the checksum costs next to the bytes it guards."""
    rows = []
    rng = np.random.default_rng(0)
    for size in sizes:
        src = rng.integers(0, 256, size, dtype=np.uint8)
        dst = np.empty_like(src)
        times: dict[str, list[float]] = {"checksum": [], "copy": []}
        loops = max(1, (64 << 20) // size)
        for _ in range(repeats):
            for name, fn in (
                ("checksum", lambda s=src: block_format.payload_checksum(s.data)),
                ("copy", lambda s=src, d=dst: np.copyto(d, s)),
            ):
                t0 = time.perf_counter()
                for _ in range(loops):
                    fn()
                times[name].append((time.perf_counter() - t0) / loops)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "block_bytes": size,
                "checksum_gbps": round(size / med["checksum"] / 1e9, 2),
                "copy_gbps": round(size / med["copy"] / 1e9, 2),
                "checksum_time_per_copy_time": round(med["checksum"] / med["copy"], 3),
            }
        )
    return rows


def timed_pair(
    a: Callable[[], object],
    b: Callable[[], object],
    setup_a: Callable[[], object],
    setup_b: Callable[[], object],
    repeats: int,
) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, alternated, after one warm-up each.

    Each setup runs untimed before its pass.
    """
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for run, setup, out in ((a, setup_a, times[0]), (b, setup_b, times[1])):
            setup()
            t0 = time.perf_counter()
            run()
            if i:
                out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def _dd(args: list[str]) -> None:
    subprocess.run(["dd", *args, "status=none"], check=True)


class _Pass:
    """Stores or loads ``count`` blocks through one handler, in jobs, and waits."""

    def __init__(self, handler: OffloadingHandler, count: int, job_blocks: int) -> None:
        self.handler, self.count, self.job_blocks = handler, count, job_blocks
        self.job = 0

    def run(self, keys: list[BlockHash], store: bool, evicted: Sequence[BlockHash] = ()) -> None:
        """``evicted[i]`` (stores): the block the store of ``keys[i]`` evicts."""
        jobs = []
        for start in range(0, self.count, self.job_blocks):
            ids = tuple(BlockId(i) for i in range(start, min(start + self.job_blocks, self.count)))
            cpu = CPULoadStoreSpec(ids)
            gone = tuple(evicted[i] for i in ids if i < len(evicted))
            disk = DiskLoadStoreSpec(ids, tuple(keys[i] for i in ids), gone)
            self.job += 1
            self.handler.transfer_async(self.job, (cpu, disk) if store else (disk, cpu))
            jobs.append(self.job)
        self.handler.wait(jobs)
        failed = [r for r in self.handler.get_finished() if not r.success]
        if failed:
            raise RuntimeError(f"{len(failed)} jobs failed, first: {failed[0].error}")


@dataclass(frozen=True, slots=True)
class _Setup:
    """One block size: where, how many blocks, the host pages they come from."""

    root: Path
    block: int
    count: int
    pages: torch.Tensor
    repeats: int
    io_threads: int
    job_blocks: int


def measure_size(
    root: Path, block: int, total: int, repeats: int, io_threads: int, job_blocks: int
) -> list[dict[str, Any]]:
    """All store and load modes, kvtier and dd, for one block size."""
    count = max(1, total // block)
    pages = torch.frombuffer(aligned_empty(count * block), dtype=torch.uint8).view(count, block)
    rng = np.random.default_rng(0)
    pages.copy_(torch.from_numpy(rng.integers(0, 256, (count, block), dtype=np.uint8)))
    setup = _Setup(root, block, count, pages, repeats, io_threads, job_blocks)
    rows = []
    for mode in STORE_MODES:
        rows.extend(_measure_mode(setup, mode))
    (root / "dd.bin").unlink(missing_ok=True)
    return rows


def _measure_mode(s: _Setup, mode: str) -> list[dict[str, Any]]:
    """Store in one mode (kvtier, then dd); for modes without fsync, load it back too."""
    direct, fsync, dd_flags = STORE_MODES[mode]
    ddfile = s.root / "dd.bin"
    fingerprint = bytes([s.block.bit_length(), int(direct), int(fsync)]) * 8
    capacity = 2 * s.count * block_file_size(s.block)
    store = DiskStore.open(s.root / "kvtier", fingerprint, capacity, fsync=fsync, direct_io=direct)
    handlers = CpuDiskOffloadingHandlers(s.pages, store, io_threads=s.io_threads)
    keys: list[BlockHash] = []
    evicted: list[BlockHash] = []
    generation = itertools.count()

    def fresh_keys() -> None:  # each pass stores new blocks, each evicting one of the last
        g = next(generation)
        evicted[:] = keys
        keys[:] = [BlockHash(f"{g}/{i}".encode().ljust(32, b".")) for i in range(s.count)]

    stores = _Pass(handlers.cpu_to_disk_handler, s.count, s.job_blocks)
    dd_write = ["if=/dev/zero", f"of={ddfile}", f"bs={s.block}", f"count={s.count}", *dd_flags]
    t_kv, t_dd = timed_pair(
        lambda: stores.run(keys, store=True, evicted=evicted),
        lambda: _dd(dd_write),
        fresh_keys,
        lambda: ddfile.unlink(missing_ok=True),
        s.repeats,
    )
    rows = [_row("store", mode, s, t_kv, t_dd, dd_flags)]
    if mode in LOAD_AFTER:
        load_mode = LOAD_AFTER[mode]
        direct_read, dd_read_flags = LOAD_MODES[load_mode]
        dd_read = [f"if={ddfile}", "of=/dev/null", f"bs={s.block}", *dd_read_flags]
        cold: Callable[[], object] = (
            (lambda: None) if direct_read else (lambda: evict_own_files(s.root))
        )
        loads = _Pass(handlers.disk_to_cpu_handler, s.count, s.job_blocks)
        t_kv, t_dd = timed_pair(
            lambda: loads.run(keys, store=False), lambda: _dd(dd_read), cold, cold, s.repeats
        )
        rows.append(_row("load", load_mode, s, t_kv, t_dd, dd_read_flags))
    handlers.shutdown()
    for k in keys:
        store.delete(k)
    store.close()
    return rows


def measure_sealed(
    root: Path, block: int, total: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Direct stores and loads of one block size, plain and sealed, side by side."""
    count = max(1, total // block)
    pages = torch.frombuffer(aligned_empty(count * block), dtype=torch.uint8).view(count, block)
    pages.copy_(
        torch.from_numpy(np.random.default_rng(1).integers(0, 256, (count, block), dtype=np.uint8))
    )
    capacity = 2 * count * block_file_size(block)
    variants = {}
    for name, keys in (("plain", ()), ("sealed", sealed.bench_keys())):
        store = DiskStore.open(
            root / name, b"\x5e" * 32, capacity, fsync=False, direct_io=True, keys=keys
        )
        handlers = CpuDiskOffloadingHandlers(pages, store, io_threads=args.io_threads)
        variants[name] = (store, handlers, _Keys(count))
    generation = itertools.count()

    def fresh(is_sealed: bool) -> None:
        variants["sealed" if is_sealed else "plain"][2].fresh(next(generation))

    def run(name: str, store: bool) -> Callable[[], None]:
        _, handlers, keys = variants[name]
        handler = handlers.cpu_to_disk_handler if store else handlers.disk_to_cpu_handler
        p = _Pass(handler, count, args.job_blocks)
        return lambda: p.run(keys.current, store=store, evicted=keys.evicted if store else ())

    rows = [
        sealed.side_by_side(
            sealed.Passes(
                op,
                block,
                count * block,
                run("plain", op == "store"),
                run("sealed", op == "store"),
                setup,
            ),
            args.repeats,
        )
        for op, setup in (("store", fresh), ("load", lambda is_sealed: None))
    ]
    for store, handlers, names in variants.values():
        handlers.shutdown()
        for k in names.current:
            store.delete(k)
        store.close()
    return rows


class _Keys:
    """The block keys of one store's latest pass, and those of the pass before it
    (which the next pass evicts, as a full cache does)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.current: list[BlockHash] = []
        self.evicted: list[BlockHash] = []

    def fresh(self, generation: int) -> None:
        self.evicted = self.current
        self.current = [
            BlockHash(f"{generation}/{i}".encode().ljust(32, b".")) for i in range(self.count)
        ]


def _row(
    op: str, mode: str, s: _Setup, t_kv: float, t_dd: float, flags: list[str]
) -> dict[str, Any]:
    block, count = s.block, s.count
    nbytes = block * count
    kv, dd = nbytes / t_kv / 1e9, nbytes / t_dd / 1e9
    return {
        "op": op,
        "mode": mode,
        "block_bytes": block,
        "blocks": count,
        "kvtier_gbps": round(kv, 3),
        "dd_gbps": round(dd, 3),
        "ratio_to_dd": round(kv / dd, 3),
        "dd_flags": " ".join(flags) or "(none)",
    }


def main(args: argparse.Namespace) -> int:
    """Measure, print a table and one summary line, write the JSON.

    Raises:
        ConfigError: a bad option (named), found before anything is measured.
    """
    sizes, total = args.sizes, args.total
    where = options.writable_directory("--dir", args.dir or Path.cwd(), create=False)
    # kvtier's files (up to twice the bytes of a pass) and dd's file, at once.
    # and the sealed side by side: two stores of up to twice a pass each
    check_disk("--total", where, 3 * total + max(sizes) + (4 * total if args.sealed_sizes else 0))
    out = check_output("--json", args.json or default_path("disk"))
    root = Path(tempfile.mkdtemp(prefix=".kvtier-bench-disk-", dir=where))
    can_drop = evict_own_files(root)
    try:
        rows = [
            r
            for s in sizes
            for r in measure_size(root, s, total, args.repeats, args.io_threads, args.job_blocks)
        ]
        sealed_rows = [r for s in args.sealed_sizes for r in measure_sealed(root, s, total, args)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'op':6} {'mode':14} {'block':>8} {'kvtier GB/s':>12} {'dd GB/s':>8} {'ratio':>6}  dd")
    for r in rows:
        print(
            f"{r['op']:6} {r['mode']:14} {r['block_bytes'] // 1024:>6}Ki "
            f"{r['kvtier_gbps']:>12.3f} {r['dd_gbps']:>8.3f} {r['ratio_to_dd']:>6.2f}  "
            f"{r['dd_flags']}"
        )
    sealed.print_rows(sealed_rows)
    config = {
        "dir": str(args.dir or Path.cwd()),
        "sizes": sizes,
        "total_bytes_per_pass": total,
        "repeats": args.repeats,
        "io_threads": args.io_threads,
        "job_blocks": args.job_blocks,
        "sealed_sizes": args.sealed_sizes,
        "page_cache_evicted": "own files, posix_fadvise DONTNEED" if can_drop else "no",
        "dd_source": "/dev/zero",
    }
    config["checksum"] = checksum_vs_copy(sizes)
    path = write_result("disk", config, rows + sealed_rows, out)
    worst = min(rows, key=lambda r: r["ratio_to_dd"])
    print(
        f"disk: worst ratio to dd {worst['ratio_to_dd']:.2f} ({worst['op']} {worst['mode']} "
        f"{worst['block_bytes'] // 1024} KiB); {sealed.summary(sealed_rows)}; own files "
        f"evicted from the page cache: {can_drop}; wrote {path}"
    )
    return 0
