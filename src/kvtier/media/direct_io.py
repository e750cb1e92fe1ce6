"""Direct I/O: aligned host buffers, a capability probe and whole-buffer pread/pwrite.

Runs on the worker side, in the disk store's I/O threads. ``O_DIRECT`` moves bytes
between the device and user memory without the page cache, which keeps a cache of
hundreds of GiB from evicting the engine's own page cache and saves one copy. It asks
that every buffer address, length and file offset be a multiple of the device's
logical block size; ``ALIGNMENT`` (4 KiB) covers every device in use today.

Not every file system accepts ``O_DIRECT`` (older tmpfs, some FUSE and network file
systems answer ``EINVAL`` at open); ``supports_direct_io`` asks the file system once,
and the disk store falls back to buffered I/O where it says no.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ALIGNMENT = 4096
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
"""``os.O_DIRECT`` where the platform has it, else 0 (direct I/O never used)."""


def aligned_empty(nbytes: int) -> np.ndarray:
    """A zero-filled ``uint8`` array of ``nbytes`` whose address is page-aligned.

    The memory is an anonymous mapping, freed when the array (and every view of it)
    is garbage collected.
    """
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def is_aligned(buf: np.ndarray) -> bool:
    """Whether ``buf`` can be handed to an ``O_DIRECT`` read or write as it is."""
    return (
        buf.flags.c_contiguous
        and buf.ctypes.data % ALIGNMENT == 0
        and buf.nbytes % ALIGNMENT == 0
        and buf.nbytes > 0
    )


def supports_direct_io(directory: Path) -> bool:
    """Whether files in ``directory`` accept aligned ``O_DIRECT`` writes.

    Creates, writes and removes one small probe file.

    Raises:
        OSError: the directory is not writable at all (not an ``O_DIRECT`` problem).
    """
    if not O_DIRECT:
        return False
    probe = directory / f".direct-probe.{uuid.uuid4().hex[:12]}.tmp"
    try:
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_DIRECT, 0o600)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            return False
        try:
            os.write(fd, aligned_empty(ALIGNMENT).data)
        except OSError as e:
            # A full disk says nothing about O_DIRECT: buffered I/O is always correct
            # (an engine restarted on a full disk must still start).
            if e.errno not in (errno.EINVAL, errno.ENOSPC, errno.EDQUOT):
                raise
            return False
        finally:
            os.close(fd)
        return True
    finally:
        probe.unlink(missing_ok=True)


def _views(buffers: Sequence[np.ndarray | bytes | bytearray | memoryview]) -> list[memoryview]:
    views = [b.data if isinstance(b, np.ndarray) else memoryview(b) for b in buffers]
    return [v.cast("B") for v in views if v.nbytes]


def _advance(views: list[memoryview], n: int) -> None:
    while views and n >= len(views[0]):
        n -= len(views.pop(0))
    if views and n:
        views[0] = views[0][n:]


def pwrite_all(fd: int, buffers: Sequence[np.ndarray | bytes | memoryview], offset: int) -> int:
    """Write ``buffers`` back to back at ``offset``, retrying short writes.

    Returns:
        The number of bytes written (all of them).

    Raises:
        OSError: as the system call does (``ENOSPC``, ``EIO``, ...).
    """
    views = _views(buffers)
    total = 0
    while views:
        n = os.pwritev(fd, views, offset + total)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        total += n
        _advance(views, n)
    return total


def pread_all(fd: int, buffers: Sequence[np.ndarray | bytearray | memoryview], offset: int) -> int:
    """Fill ``buffers`` back to back from ``offset``, retrying short reads until EOF.

    Returns:
        The number of bytes read: less than the buffers' total only at end of file.
    """
    views = _views(buffers)
    total = 0
    while views:
        n = os.preadv(fd, views, offset + total)
        if n == 0:
            break
        total += n
        _advance(views, n)
    return total


class ThreadBuffers:
    """Aligned scratch buffers, one set per thread (the I/O threads run at once)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def regions(self, n: int, size: int) -> np.ndarray:
        """``n`` aligned regions of ``size`` bytes of this thread, ``(n, size)``; one
        ``size`` per instance (the disk store's header region)."""
        regions = getattr(self._local, "regions", None)
        if regions is None or regions.shape[0] < n:
            regions = aligned_empty(max(n, 16) * size).reshape(-1, size)
            self._local.regions = regions
        return regions

    def rows(self, n: int, row_bytes: int) -> np.ndarray:
        """``n`` aligned rows of this thread of at least ``row_bytes`` each (sealing
        or opening a run's payloads without writing over the pages)."""
        stride = -(-row_bytes // ALIGNMENT) * ALIGNMENT
        rows = getattr(self._local, "rows", None)
        if rows is None or rows.shape[0] < n or rows.shape[1] < stride:
            count = max(n, rows.shape[0] if rows is not None else 0)
            rows = aligned_empty(count * stride).reshape(count, stride)
            self._local.rows = rows
        return rows
