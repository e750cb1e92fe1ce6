"""``kvtier bench disk`` evicts its own files from the page cache, and nothing else."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from kvtier.bench.disk import evict_own_files

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
