"""The disk medium: a directory of verified block files with a hard byte capacity.

Runs on the worker side. ``DiskStore`` is thread-safe: the CPU↔disk handlers call
``write``, ``read_into`` and ``delete`` from several I/O threads at once. It decides no
eviction: a write that does not fit fails, and the scheduler side (which owns the
tier's policy) deletes blocks to make room.

A block is written to a hidden temporary file in its final directory (layout in
``disk_layout``), optionally ``fdatasync``-ed, and renamed into place: a name is
visible only when its bytes are complete. A write that evicts a block of the same
size takes over that block's file (renamed to the temporary name, then overwritten in
place) instead of deleting one file and allocating another. Every load verifies
header and checksum; a block that fails is deleted and reported, never served. One
process at a time owns a fingerprint directory (an ``flock`` on its ``lock`` file), so
the accounting is exact.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.errors import ConfigError, IntegrityError, TransferError
from kvtier.media import block_format
from kvtier.media.block_format import BytesLike, Corruption
from kvtier.media.direct_io import (
    ALIGNMENT,
    O_DIRECT,
    aligned_empty,
    is_aligned,
    pread_all,
    pwrite_all,
    supports_direct_io,
)
from kvtier.media.disk_layout import (
    HEADER_REGION,
    LOCK_NAME,
    MAX_FINGERPRINT_BYTES,
    MAX_KEY_BYTES,
    TMP_SUFFIX,
    StoredBlock,
    block_file_size,
    block_path,
    fingerprint_dir,
    scan,
)

_log = logging.getLogger(__name__)


def _as_array(buf: np.ndarray | BytesLike) -> np.ndarray:
    """A flat ``uint8`` view of a C-contiguous buffer (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


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


class DiskStore:
    """A directory-backed block store. Build it with ``DiskStore.open``.

    Attributes:
        directory: the fingerprint directory holding this model's blocks.
        fingerprint: the model fingerprint digest every header must carry.
        capacity_bytes: the hard limit on bytes of block files.
        fsync: whether each block is ``fdatasync``-ed before it becomes visible.
        direct_io: whether aligned buffers bypass the page cache (``O_DIRECT``).
        recovered: the blocks found at open, least recently used first.
    """

    def __init__(
        self,
        directory: Path,
        fingerprint: bytes,
        capacity_bytes: int,
        fsync: bool,
        direct_io: bool,
        lock_fd: int,
    ) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.direct_io = direct_io
        self.recovered: tuple[StoredBlock, ...] = ()
        self._lock_fd: int | None = lock_fd
        self._mutex = threading.Lock()
        self._sizes: dict[bytes, int] = {}
        self._used = 0
        self._reserved = 0
        self._shards: set[str] = set()
        self._local = threading.local()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fingerprint: bytes,
        capacity_bytes: int,
        *,
        fsync: bool = False,
        direct_io: bool | None = None,
    ) -> DiskStore:
        """Open (or create) the store for one model under ``path``.

        Scans names and sizes only (verification happens on load), removes temporary
        files a crash left behind, and deletes the least recently used blocks if
        more than ``capacity_bytes`` are found. ``recovered`` lists what remains.

        Args:
            path: the cache directory (``disk_path``); created mode 0700 if missing.
            fingerprint: the model fingerprint digest (1..64 bytes); blocks of other
                fingerprints live in other directories and are never listed.
            capacity_bytes: the hard byte capacity (``disk_bytes_to_use``).
            fsync: ``fdatasync`` each block before it becomes visible (``disk_fsync``).
            direct_io: ``None`` to use ``O_DIRECT`` where the file system supports
                it, ``True`` to require it, ``False`` for buffered I/O only.

        Raises:
            ConfigError: path not a writable directory, capacity not positive or
                larger than the file system, direct I/O required but unsupported,
                or the directory is in use by another process.
        """
        if not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ConfigError(
                "disk_bytes_to_use", f"must be a positive int, got {capacity_bytes!r}"
            )
        if not 1 <= len(fingerprint) <= MAX_FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint digest must be 1..64 bytes, got {len(fingerprint)}")
        directory = fingerprint_dir(Path(path), fingerprint)
        try:
            for level in (*reversed(directory.parents[:2]), directory):
                level.mkdir(mode=0o700, parents=True, exist_ok=True)  # new levels: 0700
            os.chmod(directory, 0o700)
            has_direct = supports_direct_io(directory)
            lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise ConfigError(
                "disk_path", f"{path} is not a writable directory ({e}); choose another"
            ) from e
        if direct_io and not has_direct:
            os.close(lock_fd)
            raise ConfigError(
                "disk_direct_io", f"the file system at {path} does not support O_DIRECT"
            )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(lock_fd)
            raise ConfigError(
                "disk_path", f"{directory} is in use by another process; give each its own path"
            ) from e
        use_direct = has_direct if direct_io is None else direct_io
        store = cls(directory, fingerprint, capacity_bytes, fsync, use_direct, lock_fd)
        try:
            check_free_space(path, capacity_bytes, held=None)  # before the scan
            store._recover()
            vfs = os.statvfs(directory)
            available = vfs.f_bavail * vfs.f_frsize + store._used
            if capacity_bytes > available:  # a full disk is a fault, not a configuration:
                _log.warning(  # the engine starts; stores fail until space returns
                    "disk tier at %s: %d bytes asked, %d available (free space plus this "
                    "cache's blocks); stores will fail until space is freed",
                    path,
                    capacity_bytes,
                    available,
                )
        except BaseException:
            store.close()
            raise
        return store

    def _recover(self) -> None:
        found = scan(self.directory)
        total = sum(b.size for b in found)
        while found and total > self.capacity_bytes:  # the capacity was lowered
            oldest = found.pop(0)
            block_path(self.directory, oldest.key).unlink(missing_ok=True)
            total -= oldest.size
        self._shards = {p.name for p in self.directory.iterdir() if p.is_dir()}
        self._sizes = {b.key: b.size for b in found}
        self._used = total
        self.recovered = tuple(found)

    # -- accounting ------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes of complete block files."""
        return self._used

    @property
    def free_bytes(self) -> int:
        """Capacity not used by complete blocks nor reserved by writes in flight."""
        with self._mutex:
            return self.capacity_bytes - self._used - self._reserved

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[bytes]:
        """Keys of the blocks stored now (a snapshot)."""
        with self._mutex:
            return list(self._sizes)

    # -- block I/O -------------------------------------------------------------------

    def write(
        self, key: bytes, payload: np.ndarray | BytesLike, evict: Sequence[bytes] = ()
    ) -> int:
        """Store ``payload`` as block ``key`` (replacing any block of that key).

        Runs in the calling thread and blocks on I/O. Visible to ``read_into`` only
        once complete. On any failure no file is left behind and accounting is
        unchanged, except that the blocks in ``evict`` are gone.

        Args:
            key: the block's key.
            payload: the block's bytes.
            evict: blocks to remove first (the scheduler evicted them to make room).
                The file of one of them that has this block's size is reused: renamed
                to this write's temporary name and overwritten in place, which spares
                the file system an unlink, a create and a block allocation.

        Returns:
            Bytes the block takes on disk.

        Raises:
            TransferError: the store is full or closed, the key is unusable, or the
                file system failed (``ENOSPC``, ``EIO``, ...).
        """
        data = _as_array(payload)
        name = self._name(key)
        size = block_file_size(data.nbytes)
        victim = next((v for v in evict if v != key and self._sizes.get(v) == size), None)
        for other in evict:
            if other != victim:
                self.delete(other)
        with self._mutex:
            if self._lock_fd is None:
                raise TransferError("disk store is closed")
            if victim is not None:  # its bytes become this write's reservation
                self._used -= self._sizes.pop(victim, 0)
            if self._used + self._reserved + size > self.capacity_bytes:
                raise TransferError(
                    f"disk tier full: block {name[:16]} needs {size} bytes, "
                    f"{self.capacity_bytes - self._used - self._reserved} free"
                )
            self._reserved += size
        final = self._path(key)
        tmp: Path | None = final.parent / f".{name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"
        try:
            region = self._header_region(
                block_format.encode_header(key, self.fingerprint, data.data)
            )
            self._ensure_shard(final.parent)
            assert tmp is not None
            fd = self._open_for_write(tmp, victim, direct=self.direct_io and is_aligned(data))
            try:
                pwrite_all(fd, [region, data], 0)
                now = time.time_ns()
                os.utime(fd, ns=(now, now))
                if self.fsync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            tmp = None
        except OSError as e:
            raise TransferError(f"disk write of block {name[:16]} failed: {e}") from e
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            with self._mutex:
                self._reserved -= size
                if tmp is None:
                    self._used += size - self._sizes.get(key, 0)
                    self._sizes[key] = size
        return size

    def read_into(self, key: bytes, out: np.ndarray | bytearray | memoryview) -> None:
        """Load block ``key`` into ``out`` (exactly its payload length) and verify it.

        Runs in the calling thread and blocks on I/O. Reads straight into ``out``
        (with ``O_DIRECT`` when ``out`` is aligned); on any failure ``out`` is
        zero-filled, so no wrong bytes are left looking plausible, and a block that
        fails verification is deleted.

        Raises:
            IntegrityError: the block failed verification (``reason`` says why).
            TransferError: the block is not stored, or the read failed.
        """
        dest = _as_array(out)
        name = self._name(key)
        path = self._path(key)
        direct = O_DIRECT if self.direct_io and is_aligned(dest) else 0
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | direct)
        except FileNotFoundError:
            self._forget(key)
            raise TransferError(f"block {name[:16]} is not on disk") from None
        except OSError as e:
            raise TransferError(f"disk read of block {name[:16]} failed: {e}") from e
        try:
            expected = block_file_size(dest.nbytes)
            region, tail = self._region(), self._tail()
            got = pread_all(fd, [region, dest, tail], 0)  # the tail sees a longer file
            if got != expected:
                raise block_format.corruption(
                    Corruption.TRUNCATED if got < expected else Corruption.LENGTH_MISMATCH,
                    f"file has {'only ' if got < expected else 'over '}{got} bytes, "
                    f"a {dest.nbytes}-byte block has {expected}",
                )
            block_format.verify(region.data, dest.data, key=key, fingerprint=self.fingerprint)
            now = time.time_ns()
            os.utime(fd, ns=(now, now))  # last use, for the LRU order at the next open
        except IntegrityError as e:
            dest[:] = 0
            self._discard(key)
            raise IntegrityError(f"block {name[:16]}: {e}", reason=e.reason) from e
        except OSError as e:
            dest[:] = 0
            raise TransferError(f"disk read of block {name[:16]} failed: {e}") from e
        finally:
            os.close(fd)

    def delete(self, key: bytes) -> bool:
        """Remove block ``key``; ``False`` if it was not stored. Never raises for I/O."""
        if key not in self._sizes:
            return False
        self._discard(key)
        return True

    def close(self) -> None:
        """Release the directory lock. Writes after this fail; files stay on disk."""
        with self._mutex:
            fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    # -- internals -------------------------------------------------------------------

    def _name(self, key: bytes) -> str:
        if not 1 <= len(key) <= MAX_KEY_BYTES:
            raise TransferError(f"a disk block key is 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        return key.hex()

    def _path(self, key: bytes) -> Path:
        return block_path(self.directory, key)

    def _open_for_write(self, tmp: Path, victim: bytes | None, direct: bool) -> int:
        """A new file at ``tmp``, or ``victim``'s file renamed to ``tmp`` (same size).

        Either way ``tmp`` is a temporary name: if the write never completes, the
        next ``open`` deletes it, so a half-overwritten victim is never served.
        """
        flags = os.O_WRONLY | os.O_CLOEXEC | (O_DIRECT if direct else 0)
        if victim is not None:
            try:
                os.rename(self._path(victim), tmp)
                return os.open(tmp, flags)
            except FileNotFoundError:  # gone meanwhile (deleted, or never written)
                pass
        return os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o600)

    def _ensure_shard(self, shard: Path) -> None:
        if shard.name not in self._shards:
            shard.mkdir(mode=0o700, exist_ok=True)
            self._shards.add(shard.name)

    def _region(self) -> np.ndarray:
        region = getattr(self._local, "region", None)
        if region is None:
            region = self._local.region = aligned_empty(HEADER_REGION)
        return region

    def _tail(self) -> np.ndarray:
        tail = getattr(self._local, "tail", None)
        if tail is None:
            tail = self._local.tail = aligned_empty(ALIGNMENT)
        return tail

    def _header_region(self, header: bytes) -> np.ndarray:
        region = self._region()
        region[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        region[len(header) :] = 0
        return region

    def _forget(self, key: bytes) -> None:
        with self._mutex:
            self._used -= self._sizes.pop(key, 0)

    def _discard(self, key: bytes) -> None:
        with contextlib.suppress(OSError):  # counted as gone; the next open rescans
            self._path(key).unlink(missing_ok=True)
        self._forget(key)
