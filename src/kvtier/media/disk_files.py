"""The open files of one disk-tier directory: segment files, index files and records.

Runs on the worker side, inside ``DiskStore``, from its I/O threads at once: opening a
file is idempotent (two threads that open the same one keep one descriptor), and every
write is positional (``pwrite``), so no offset is shared. The layout (which file holds
which slot, at which offset) is ``disk_layout``'s; which slot holds which block is
``disk_slots``'.

Each segment file is opened twice at most: buffered, and with ``O_DIRECT`` for aligned
buffers. An index record is written after its slot's bytes; it is a hint (every load
verifies the slot's own header), so a record that fails to be cleared costs at most a
miss at the next open.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import numpy as np

from kvtier.errors import ConfigError
from kvtier.media.direct_io import O_DIRECT, pread_all, pwrite_all
from kvtier.media.disk_layout import (
    RECORD_BYTES,
    Slot,
    index_path,
    segment_path,
    slot_offset,
    slots_per_segment,
)


def check_free_space(path: str | os.PathLike[str], capacity_bytes: int, held: int | None) -> None:
    """Raise ``ConfigError('disk_bytes_to_use')`` if ``capacity_bytes`` cannot fit at ``path``.

    Costs one ``statvfs`` and allocates nothing, so a caller can run it before it
    sizes anything from ``capacity_bytes``. ``held``: bytes this cache already holds
    there (they count as available), or ``None`` before they are known: then the
    check is against the whole file system's size, which no cache can exceed.

    Raises:
        ConfigError: naming ``disk_bytes_to_use``, with what is available.
    """
    vfs = os.statvfs(path)
    if held is None:
        available, where = vfs.f_blocks * vfs.f_frsize, " in the whole file system"
    else:
        available = vfs.f_bavail * vfs.f_frsize + held
        where = f" (free space plus the {held} this cache holds)"
    if capacity_bytes > available:
        raise ConfigError(
            "disk_bytes_to_use",
            f"{capacity_bytes} bytes ({capacity_bytes / 2**30:.1f} GiB) asked but {path} has "
            f"{available} ({available / 2**30:.1f} GiB) available{where}; "
            "lower it or free space",
        )


class SegmentFiles:
    """Descriptors of the segment and index files of one directory, opened on first use.

    Attributes:
        directory: the fingerprint directory the files live in.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[tuple[int, int, bool], int] = {}  # (slot bytes, segment, direct)
        self._index_fds: dict[int, int] = {}

    def fd(self, slot: Slot, direct: bool) -> int:
        """The descriptor of the segment file holding ``slot`` (created if missing)."""
        seg = slot_offset(slot)[0]
        key = (slot.slot_bytes, seg, direct)
        fd = self._fds.get(key)
        if fd is None:
            path = segment_path(self.directory, slot.slot_bytes, seg)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (O_DIRECT if direct else 0)
            fd = os.open(path, flags, 0o600)
            if self._fds.setdefault(key, fd) != fd:  # another thread opened it first
                os.close(fd)
                fd = self._fds[key]
        return fd

    def index_fd(self, slot_bytes: int) -> int:
        """The descriptor of the index file of slots of ``slot_bytes`` (created if missing)."""
        fd = self._index_fds.get(slot_bytes)
        if fd is None:
            path = index_path(self.directory, slot_bytes)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if self._index_fds.setdefault(slot_bytes, fd) != fd:
                os.close(fd)
                fd = self._index_fds[slot_bytes]
        return fd

    def write_record(self, slot: Slot, record: bytes, raise_errors: bool = False) -> None:
        """Write ``slot``'s index record; an I/O error is ignored unless ``raise_errors``
        (a record not cleared is a hint the next open may list; its load verifies)."""
        try:
            os.pwrite(self.index_fd(slot.slot_bytes), record, slot.index * RECORD_BYTES)
        except OSError:
            if raise_errors:
                raise

    def grow(self, slot_bytes: int, have: int, target: int) -> None:
        """Give slots ``have .. target-1`` of that size file space (all in the segment of
        slot ``have``) and index records.

        Raises:
            OSError: the file system refused (``ENOSPC``, ...).
        """
        per = slots_per_segment(slot_bytes)
        seg = have // per
        fd = self.fd(Slot(slot_bytes, have), direct=False)
        try:
            os.posix_fallocate(fd, 0, (target - seg * per) * slot_bytes)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(fd, (target - seg * per) * slot_bytes)
        os.ftruncate(self.index_fd(slot_bytes), target * RECORD_BYTES)

    def copy_slot(self, src: Slot, dst: Slot) -> None:
        """Copy the whole of slot ``src`` (header and payload) over slot ``dst``."""
        buf = np.empty(src.slot_bytes, np.uint8)
        pread_all(self.fd(src, direct=False), [buf], slot_offset(src)[1])
        pwrite_all(self.fd(dst, direct=False), [buf], slot_offset(dst)[1])

    def cut(self, slot_bytes: int, have: int, limit: int) -> None:
        """Shorten the files of slots of that size from ``have`` slots to ``limit``:
        segments past it are removed, the one it ends in is cut, the index too."""
        self.close()
        per = slots_per_segment(slot_bytes)
        for seg in range(limit // per, -(-have // per)):
            path = segment_path(self.directory, slot_bytes, seg)
            keep = max(0, limit - seg * per) * slot_bytes
            if keep:
                os.truncate(path, keep)
            else:
                path.unlink(missing_ok=True)
        os.ftruncate(self.index_fd(slot_bytes), limit * RECORD_BYTES)

    def close(self) -> None:
        """Close every descriptor (later calls open them again)."""
        for fd in [*self._fds.values(), *self._index_fds.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._index_fds.clear()
