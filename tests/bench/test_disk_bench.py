"""``kvtier bench disk``: evicts its own files from the page cache, and nothing else;
stores as a full cache does."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.bench.disk import _Pass, evict_own_files
from kvtier.blocks import BlockHash
from kvtier.cli import main
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

from .rounded import assert_sealed_rows

PAGE = mmap.PAGESIZE


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache now (``mincore`` over a read-only map)."""
    size = path.stat().st_size
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)  # only to learn the map's address
        ok = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
    if ok != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise (Linux)")
def test_evicts_only_files_under_its_root(tmp_path: Path) -> None:
    ours, other = tmp_path / "bench", tmp_path / "other"
    (ours / "shard").mkdir(parents=True)
    other.mkdir()
    files = [ours / "shard" / "a.kvb", ours / "dd.bin", other / "keep.bin"]
    for f in files:
        f.write_bytes(os.urandom(64 * PAGE))
        f.read_bytes()  # cached now
    assert [resident_pages(f) for f in files] == [64, 64, 64]
    assert evict_own_files(ours) is True
    assert [resident_pages(f) for f in files] == [0, 0, 64]


def test_store_passes_evict_the_last_pass_through_the_job_and_reuse_its_slots(
    tmp_path: Path,
) -> None:
    """The benchmark's stores run as a full cache's do: each block of a pass evicts one
    of the previous pass, named in the store job, and takes over its slot."""
    count, block = 6, 16384
    store = DiskStore.open(tmp_path, b"\x01" * 8, count * block_file_size(block))
    pages = torch.frombuffer(aligned_empty(count * block), dtype=torch.uint8).view(count, block)
    handlers = CpuDiskOffloadingHandlers(pages, store, io_threads=2)
    stores = _Pass(handlers.cpu_to_disk_handler, count, job_blocks=4)
    first = [BlockHash(f"a{i}".encode()) for i in range(count)]
    second = [BlockHash(f"b{i}".encode()) for i in range(count)]
    stores.run(first, store=True)
    segments = {(p, p.stat().st_ino, p.stat().st_size) for p in tmp_path.rglob("*.seg")}
    slots = {store.locate(bytes(k)) for k in first}
    stores.run(second, store=True, evicted=first)  # the cache is full: it must evict
    assert sorted(store.keys()) == sorted(second)
    assert {store.locate(bytes(k)) for k in second} == slots
    assert {(p, p.stat().st_ino, p.stat().st_size) for p in tmp_path.rglob("*.seg")} == segments
    assert len(segments) == 1
    handlers.shutdown()
    store.close()


def test_bench_disk_writes_its_json_with_sealed_beside_plain(tmp_path: Path) -> None:
    out = tmp_path / "disk.json"
    args = ["bench", "disk", "--dir", str(tmp_path), "--sizes", "64KiB", "--total", "1MiB"]
    args += ["--repeats", "3", "--sealed-sizes", "64KiB", "--json", str(out)]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    sealed = [r for r in doc["results"] if r.get("compare") == "sealed/plain"]
    assert [(r["op"], r["mode"]) for r in doc["results"] if r not in sealed] == [
        ("store", "direct"),
        ("load", "direct"),
        ("store", "direct+sync"),
        ("store", "buffered+sync"),
        ("load", "buffered"),
    ]
    assert doc["config"]["sealed_sizes"] == [65536]
    assert_sealed_rows(sealed, 65536, repeats=3)
    assert [p.name for p in tmp_path.iterdir()] == ["disk.json"]  # its directory removed
