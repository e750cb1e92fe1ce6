"""The disk medium: verified blocks in fixed slots of preallocated segment files.

Runs on the worker side. ``DiskStore`` is thread-safe: the CPU↔disk handlers call
``write_blocks``, ``read_blocks`` and ``delete`` from several I/O threads at once. It
decides no eviction: a write that does not fit fails, and the scheduler side (which
owns the tier's policy) deletes blocks to make room.

Blocks live in slots of segment files (layout in ``disk_layout``; which slot holds what
in ``disk_slots``; the open files in ``disk_files``; what an open finds in
``disk_recovery``). Blocks written together get consecutive slots where possible and
are written with one ``pwritev``; blocks read together that sit in consecutive slots
are read with one ``preadv``, so the kernel sees one sequential stream, as ``dd`` gives
it. A slot's index record is written after its bytes; every load verifies the slot's
own header (key, fingerprint, length) and checksum, so a torn write, a stale record or
a slot reused for another key is a miss, never wrong bytes (``docs/disk.md``). One
process at a time owns a fingerprint directory (``disk_claim``), so the accounting is
exact.

With an ``encryption_key_file`` the store's ``BlockCodec`` seals every block it writes
(``sealing``: AES-256-GCM bound to the block's key and the model) and opens only sealed
blocks; the slots, records and runs are the same, a slot's payload is then ciphertext
of the same length. Sealing and opening go through a per-thread buffer of the run,
so the pages themselves are never written over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.errors import ConfigError, IntegrityError, TransferError
from kvtier.key_file import EncryptionKey
from kvtier.media import block_format
from kvtier.media.block_codec import BlockCodec, codec_for, sealing_bytes
from kvtier.media.block_format import BytesLike, Corruption
from kvtier.media.direct_io import (
    ThreadBuffers,
    is_aligned,
    pread_all,
    pwrite_all,
)
from kvtier.media.disk_claim import claim
from kvtier.media.disk_files import SegmentFiles, check_free_space
from kvtier.media.disk_layout import (
    EMPTY_RECORD,
    HEADER_REGION,
    MAX_FINGERPRINT_BYTES,
    MAX_KEY_BYTES,
    Slot,
    StoredBlock,
    block_file_size,
    consecutive_runs,
    encode_record,
    segment_path,
    slot_offset,
    slots_per_segment,
)
from kvtier.media.disk_recovery import recover
from kvtier.media.disk_slots import SlotTable
from kvtier.media.forks import renew_after_fork

_log = logging.getLogger(__name__)
MAX_RUN_BYTES = 4 << 20
"""Most payload bytes in one read or write of consecutive slots: a job of 16 blocks of
256 KiB is one request the size of ``dd``'s largest reads here (4 MiB,
``max_sectors_kb``); jobs of larger blocks still spread over the I/O threads."""


def _as_array(buf: np.ndarray | BytesLike) -> np.ndarray:
    """A flat ``uint8`` view of a C-contiguous buffer (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


class DiskStore:
    """A directory of segment files holding verified blocks. Build it with ``DiskStore.open``.

    Attributes:
        directory: the fingerprint directory holding this model's blocks.
        fingerprint: the model fingerprint digest every header must carry.
        capacity_bytes: the hard limit on bytes of slots holding (or being written with)
            blocks; with one block size, also on the bytes of segment files.
        fsync: whether each write is ``fdatasync``-ed (slots, then index) before it
            becomes visible.
        direct_io: whether aligned buffers bypass the page cache (``O_DIRECT``).
        recovered: the blocks found at open, least recently used first.
        codec: how blocks are written and read (sealed with a key, or plaintext).
    """

    def __init__(
        self,
        directory: Path,
        codec: BlockCodec,
        capacity_bytes: int,
        fsync: bool,
        direct_io: bool,
        lock_fd: int,
    ) -> None:
        self.directory = directory
        self.fingerprint = codec.fingerprint
        self.codec = codec
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.direct_io = direct_io
        self.recovered: tuple[StoredBlock, ...] = ()
        self._lock_fd: int | None = lock_fd
        self._mutex = threading.Lock()
        renew_after_fork(self)
        self._table = SlotTable(capacity_bytes)
        self._last_use: dict[bytes, int] = {}
        self._stale_use: set[bytes] = set()  # loaded since their record was written
        self._files = SegmentFiles(directory)
        self._buffers = ThreadBuffers()

    def _after_fork(self) -> None:
        """In a forked child: a new mutex (a parent's I/O thread may have held the old
        one at the fork, for good in the child); the slots reserved by the parent's
        writes in flight are free again (nothing in the child would commit or release
        them). The child then shares the directory with the parent: a slot one of them
        rewrites is a miss for the other (every header names its block, every payload
        has its checksum), never wrong bytes."""
        self._mutex = threading.Lock()
        self._table.recount()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fingerprint: bytes,
        capacity_bytes: int,
        *,
        fsync: bool = False,
        direct_io: bool | None = None,
        keys: Sequence[EncryptionKey] = (),
    ) -> DiskStore:
        """Open (or create) the store for one model under ``path``.

        Reads the index files (verification happens on load), deletes the least
        recently used blocks if more than ``capacity_bytes`` are found, moves blocks
        out of slots the capacity no longer allows and shortens the segment files to
        it. ``recovered`` lists what remains.

        Args:
            path: the cache directory (``disk_path``); created mode 0700 if missing.
            fingerprint: the model fingerprint digest (1..64 bytes); blocks of other
                fingerprints live in other directories and are never listed.
            capacity_bytes: the hard byte capacity (``disk_bytes_to_use``).
            fsync: ``fdatasync`` each write before it becomes visible (``disk_fsync``).
            direct_io: ``None`` to use ``O_DIRECT`` where the file system supports
                it, ``True`` to require it, ``False`` for buffered I/O only.
            keys: the keys of ``encryption_key_file`` (the first seals every block,
                each opens its own); none: blocks are plaintext (verified).

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
        directory, use_direct, lock_fd = claim(Path(path), fingerprint, direct_io)
        codec = codec_for(fingerprint, keys)
        store = cls(directory, codec, capacity_bytes, fsync, use_direct, lock_fd)
        try:
            check_free_space(path, capacity_bytes, held=None)  # before the scan
            store._recover()
            vfs = os.statvfs(directory)
            available = vfs.f_bavail * vfs.f_frsize + store.used_bytes
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
        found = recover(self._files, self._table, self.capacity_bytes)
        self._last_use, self.recovered = found.last_use, found.blocks

    # -- accounting ------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes of slots holding complete blocks."""
        return self._table.used_bytes

    @property
    def free_bytes(self) -> int:
        """Capacity not used by complete blocks nor reserved by writes in flight."""
        with self._mutex:
            return self.capacity_bytes - self._table.used_bytes - self._table.reserved_bytes

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __len__(self) -> int:
        return len(self._table)

    def keys(self) -> list[bytes]:
        """Keys of the blocks stored now (a snapshot)."""
        with self._mutex:
            return self._table.keys()

    def locate(self, key: bytes) -> tuple[Path, int] | None:
        """``(segment file, byte offset of the slot)`` of block ``key``, or ``None``.

        For tools and tests (damaging a block on purpose); the store never needs it.
        """
        with self._mutex:
            slot = self._table.lookup(key)
        if slot is None:
            return None
        seg, offset = slot_offset(slot)
        return segment_path(self.directory, slot.slot_bytes, seg), offset

    # -- block I/O -------------------------------------------------------------------

    def write(
        self, key: bytes, payload: np.ndarray | BytesLike, evict: Sequence[bytes] = ()
    ) -> int:
        """Store one block; ``write_blocks`` with one key. Returns its bytes on disk."""
        return self.write_blocks([key], [payload], evict)

    def write_blocks(
        self,
        keys: Sequence[bytes],
        payloads: Sequence[np.ndarray | BytesLike],
        evict: Sequence[bytes] = (),
    ) -> int:
        """Store ``payloads`` as blocks ``keys`` (replacing blocks of those keys), together.

        Runs in the calling thread and blocks on I/O. All blocks or none: on any
        failure none of them is stored and accounting is unchanged, except that the
        blocks in ``evict`` are gone. Blocks of one size get consecutive slots where a
        free run exists, and each run is one ``pwritev``; the index records follow the
        bytes. Visible to ``read_blocks`` only once all are complete.

        Args:
            keys: the blocks' keys (distinct).
            payloads: their bytes, one buffer each.
            evict: blocks to remove first (the scheduler evicted them to make room);
                their slots are free for these blocks.

        Returns:
            Bytes the blocks take on disk.

        Raises:
            TransferError: the store is full or closed, a key is unusable, or the
                file system failed (``ENOSPC``, ``EIO``, ...).
        """
        datas = [_as_array(p) for p in payloads]
        names = [self._name(k) for k in keys]
        if len(datas) != len(keys) or len(set(keys)) != len(keys):
            raise TransferError("write_blocks needs one payload per key, keys distinct")
        for other in evict:
            if other not in keys:
                self.delete(other)
        sizes = {block_file_size(d.nbytes) for d in datas}
        if len(sizes) > 1:  # slots of several sizes: one size at a time
            return sum(self.write_blocks([k], [d]) for k, d in zip(keys, datas, strict=True))
        if not datas:
            return 0
        (slot_bytes,) = sizes
        with self._mutex:
            if self._lock_fd is None:
                raise TransferError("disk store is closed")
            slots = self._reserve(slot_bytes, len(datas), names[0])
        done = False
        try:
            now = time.time_ns()
            regions = self._buffers.regions(len(datas), HEADER_REGION)
            spare = (
                self._buffers.rows(len(datas), sealing_bytes(datas[0].nbytes))
                if self.codec.sealed
                else None
            )
            bodies = []
            for i, (k, d) in enumerate(zip(keys, datas, strict=True)):
                header, body = self.codec.seal(k, d, None if spare is None else spare[i])
                regions[i, : len(header)] = np.frombuffer(header, dtype=np.uint8)
                regions[i, len(header) :] = 0
                bodies.append(body)
            for run in consecutive_runs(slots):
                direct = self.direct_io and all(is_aligned(bodies[i]) for i in run)
                buffers: list[np.ndarray] = []
                for i in run:
                    buffers += [regions[i], bodies[i]]
                fd = self._files.fd(slots[run[0]], direct)
                pwrite_all(fd, buffers, slot_offset(slots[run[0]])[1])
                if self.fsync:
                    os.fdatasync(fd)
            for k, slot in zip(keys, slots, strict=True):
                self._files.write_record(slot, encode_record(k, now), raise_errors=True)
            if self.fsync:
                os.fdatasync(self._files.index_fd(slot_bytes))
            done = True
        except OSError as e:
            raise TransferError(f"disk write of block {names[0][:16]} failed: {e}") from e
        finally:
            with self._mutex:
                for k, slot in zip(keys, slots, strict=True):
                    if done:  # the slot it held before is free: its record goes
                        if (old := self._table.commit(k, slot)) is not None:
                            self._files.write_record(old, EMPTY_RECORD)
                        self._last_use[k] = now
                        self._stale_use.discard(k)
                    else:
                        self._table.release(slot)
        return slot_bytes * len(datas)

    def read_into(self, key: bytes, out: np.ndarray | bytearray | memoryview) -> None:
        """Load block ``key`` into ``out`` (exactly its payload length) and verify it.

        ``read_blocks`` with one key: on failure it raises the block's own error.

        Raises:
            IntegrityError: the block failed verification (``reason`` says why).
            TransferError: the block is not stored, or the read failed.
        """
        failed = self.read_blocks([key], [out])
        if failed:
            raise failed[0]

    def read_blocks(
        self, keys: Sequence[bytes], outs: Sequence[np.ndarray | bytearray | memoryview]
    ) -> list[TransferError]:
        """Load blocks ``keys`` into ``outs`` (each exactly its payload length), verified.

        Runs in the calling thread and blocks on I/O. Blocks in consecutive slots (in
        the order given) are read with one ``preadv`` (``O_DIRECT`` when every page of
        the run is aligned). Every block's header, key, fingerprint, length and
        checksum are checked (a sealed block's seal). A block that fails has its
        ``out`` zero-filled, so no wrong bytes are left looking plausible; one that
        fails verification (or does not open) is deleted.

        Returns:
            The failures, one error per failed block (``IntegrityError`` with its
            ``reason``, or ``TransferError``), each naming its block; empty if all
            loaded.
        """
        dests = [_as_array(o) for o in outs]
        names = [self._name(k) for k in keys]
        with self._mutex:
            slots = [self._table.lookup(k) for k in keys]
        failed: list[TransferError] = []
        todo: list[int] = []
        for i, slot in enumerate(slots):
            if slot is None:
                failed.append(TransferError(f"block {names[i][:16]} is not on disk"))
            elif slot.slot_bytes != block_file_size(dests[i].nbytes):
                err = block_format.corruption(
                    Corruption.LENGTH_MISMATCH,
                    f"its slot holds {slot.slot_bytes - HEADER_REGION} payload bytes, "
                    f"{dests[i].nbytes} asked",
                )
                failed.append(self._failed(keys[i], slot, dests[i], err))
            else:
                todo.append(i)
        regions = self._buffers.regions(len(keys), HEADER_REGION)
        stored = dests  # where payloads land: the pages, or (sealed) this thread's buffer
        if self.codec.sealed and dests:
            spare = self._buffers.rows(len(dests), sealing_bytes(max(d.nbytes for d in dests)))
            stored = [spare[i, : sealing_bytes(d.nbytes)] for i, d in enumerate(dests)]
        loaded: list[int] = []
        for run in consecutive_runs([slots[i] for i in todo]):
            idx = [todo[r] for r in run]
            first = slots[idx[0]]
            assert first is not None
            slot_bytes = first.slot_bytes
            direct = self.direct_io and all(is_aligned(dests[i]) for i in idx)
            buffers: list[np.ndarray] = []
            for i in idx:
                buffers += [regions[i], stored[i][: dests[i].nbytes]]
            try:
                got = pread_all(self._files.fd(first, direct), buffers, slot_offset(first)[1])
            except OSError as e:
                for i in idx:
                    dests[i][:] = 0
                    failed.append(TransferError(f"disk read of block {names[i][:16]} failed: {e}"))
                continue
            for n, i in enumerate(idx):
                slot = slots[i]
                assert slot is not None
                try:
                    if got < n * slot_bytes + HEADER_REGION + dests[i].nbytes:
                        raise block_format.corruption(
                            Corruption.TRUNCATED, "its segment file ends inside its slot"
                        )
                    self.codec.open(keys[i], regions[i].data, stored[i], dests[i])
                    loaded.append(i)
                except IntegrityError as e:
                    failed.append(self._failed(keys[i], slot, dests[i], e))
        now = time.time_ns()
        with self._mutex:
            for i in loaded:
                if keys[i] in self._table:
                    self._last_use[keys[i]] = now
                    self._stale_use.add(keys[i])
        return failed

    def runs(self, keys: Sequence[bytes], max_bytes: int = MAX_RUN_BYTES) -> list[list[int]]:
        """Positions in ``keys`` grouped for loading: blocks in consecutive slots together.

        A group is a stretch of ``keys`` whose slots follow each other in one segment
        (one ``preadv`` then), cut at ``max_bytes`` of payload; unknown keys are a
        group each.
        A snapshot: blocks moved meanwhile are still loaded correctly, only in more reads.
        """
        with self._mutex:
            slots = [self._table.lookup(k) for k in keys]
        groups: list[list[int]] = []
        for run in consecutive_runs(slots):
            slot = slots[run[0]]
            per = 1 if slot is None else max(1, max_bytes // (slot.slot_bytes - HEADER_REGION))
            groups += [run[i : i + per] for i in range(0, len(run), per)]
        return groups

    def delete(self, key: bytes) -> bool:
        """Remove block ``key``; ``False`` if it was not stored. Never raises for I/O."""
        with self._mutex:
            slot = self._table.remove(key)
            if slot is None:
                return False
            self._last_use.pop(key, None)
            self._stale_use.discard(key)
            self._files.write_record(slot, EMPTY_RECORD)
        return True

    def close(self) -> None:
        """Write the last-use times of loaded blocks, release files and the lock.

        Writes after this fail; blocks stay on disk for the next ``open``.
        """
        with self._mutex:
            fd, self._lock_fd = self._lock_fd, None
            for key in self._stale_use:
                slot = self._table.lookup(key)
                if slot is not None:
                    self._files.write_record(slot, encode_record(key, self._last_use[key]))
            self._stale_use.clear()
            self._files.close()
        if fd is not None:
            os.close(fd)

    # -- internals -------------------------------------------------------------------

    def _name(self, key: bytes) -> str:
        if not 1 <= len(key) <= MAX_KEY_BYTES:
            raise TransferError(f"a disk block key is 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        return key.hex()

    def _reserve(self, slot_bytes: int, n: int, name: str) -> list[Slot]:
        """``n`` slots (mutex held), growing the segment files if that makes a run."""
        table = self._table
        while (
            table.fits(slot_bytes, n)
            and not table.has_run(slot_bytes, n)
            and table.slots(slot_bytes) < table.limit(slot_bytes)
        ):
            self._grow(slot_bytes, name)
        slots = table.reserve(slot_bytes, n)
        if slots is None:
            free = self.capacity_bytes - table.used_bytes - table.reserved_bytes
            raise TransferError(
                f"disk tier full: block {name[:16]} needs {n * slot_bytes} bytes, {free} free"
            )
        return slots

    def _grow(self, slot_bytes: int, name: str) -> None:
        """Add the rest of the last segment, or a new one, up to the capacity's limit."""
        have, per = self._table.slots(slot_bytes), slots_per_segment(slot_bytes)
        target = min(self._table.limit(slot_bytes), (have // per + 1) * per)
        try:
            self._files.grow(slot_bytes, have, target)
        except OSError as e:
            raise TransferError(f"disk write of block {name[:16]} failed: {e}") from e
        self._table.grow(slot_bytes, target)

    def _failed(
        self, key: bytes, slot: Slot, dest: np.ndarray, error: IntegrityError
    ) -> IntegrityError:
        """Zero the page, delete the block (if it is still at ``slot``), name it."""
        dest[:] = 0
        with self._mutex:
            if self._table.remove(key, slot) is not None:
                self._last_use.pop(key, None)
                self._stale_use.discard(key)
                self._files.write_record(slot, EMPTY_RECORD)
        return IntegrityError(f"block {key.hex()[:16]}: {error}", reason=error.reason)
