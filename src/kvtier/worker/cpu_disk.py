"""CPU <-> disk offloading: one handler each way over a ``DiskStore`` and a thread pool.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and hands one task per block to the direction's thread pool, so several block
reads or writes are in flight at once (the system calls release the GIL). A job
finishes when all its blocks have; ``get_finished`` reports jobs in submission order
even when the pool finishes them out of order, each with per-job success and, on
failure, which blocks failed and why. Nothing a job does raises out of the handler.

Loads and stores have separate pools, so a burst of background write-through stores
never queues a load (which a request is waiting for) behind it in Python.

After a failed load, the destination CPU pages of that job are undefined (a block
that failed verification is zero-filled, its siblings may hold good bytes): the
scheduler drops the whole job's blocks, as it does for any failed store.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import KvtierError
from kvtier.media.disk import DiskStore
from kvtier.specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec

logger = logging.getLogger(__name__)

MAX_ERRORS_SHOWN = 3


@dataclass(slots=True)
class _Job:
    """A job in flight (mutable; guarded by the handler's condition)."""

    job_id: int
    pending: int
    bytes_moved: int = 0
    errors: list[str] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    refused: str | None = None

    @property
    def done(self) -> bool:
        return self.pending == 0

    def result(self) -> TransferResult:
        if self.refused is not None:
            return TransferResult.failed(self.job_id, self.refused)
        seconds = (self.ended or 0.0) - (self.started or 0.0)
        if not self.errors:
            return TransferResult(self.job_id, True, self.bytes_moved, seconds)
        shown = "; ".join(self.errors[:MAX_ERRORS_SHOWN])
        more = len(self.errors) - MAX_ERRORS_SHOWN
        error = f"{len(self.errors)} block(s) failed: {shown}" + (
            f"; {more} more" if more > 0 else ""
        )
        return TransferResult(self.job_id, False, 0, seconds, error)


class CpuDiskHandler(OffloadingHandler):
    """CPU->disk (stores) or disk->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuDiskOffloadingHandlers``.
    """

    def __init__(
        self,
        *,
        cpu_to_disk: bool,
        pages: np.ndarray,
        store: DiskStore,
        io_threads: int,
        slot_keys: dict[int, bytes] | None = None,
    ) -> None:
        self.cpu_to_disk = cpu_to_disk
        self.src_medium, self.dst_medium = (
            (Medium.CPU, Medium.DISK) if cpu_to_disk else (Medium.DISK, Medium.CPU)
        )
        self._pages = pages
        self._store = store
        self._slot_keys = slot_keys  # disk slot -> key it holds; None: no tracking
        direction = "store" if cpu_to_disk else "load"
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix=f"kvtier-disk-{direction}")
        self._cv = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._by_id: dict[int, _Job] = {}
        self._shut = False

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Validate and submit; a refused job (False) is reported failed, in order."""
        try:
            blocks = self._plan(spec)
        except (KvtierError, TypeError, ValueError, AttributeError) as exc:
            return self._refuse(job_id, f"invalid transfer spec: {exc}")
        job = _Job(job_id, pending=len(blocks))
        with self._cv:
            if self._shut:
                job.refused, job.pending = "handler is shut down", 0
            self._jobs.append(job)
            self._by_id[job_id] = job
            if job.refused is not None:
                return False
            submitted = 0
            try:
                for key, row, slot in blocks:
                    self._pool.submit(self._run_block, job, key, row, slot)
                    submitted += 1
            except RuntimeError as exc:  # interpreter shutdown: report, do not raise
                job.errors.append(f"not submitted: {exc}")
                job.pending -= len(blocks) - submitted
        return True

    def _refuse(self, job_id: int, why: str) -> bool:
        with self._cv:
            job = _Job(job_id, pending=0, refused=why)
            self._jobs.append(job)
            self._by_id[job_id] = job
        return False

    def _plan(self, spec: TransferSpec) -> list[tuple[bytes, int, int]]:
        src, dst = spec
        cpu, disk = (src, dst) if self.cpu_to_disk else (dst, src)
        if not isinstance(cpu, CPULoadStoreSpec) or not isinstance(disk, DiskLoadStoreSpec):
            raise TypeError(
                f"{self.src_medium}->{self.dst_medium} takes "
                f"({'CPU' if self.cpu_to_disk else 'DISK'}, "
                f"{'DISK' if self.cpu_to_disk else 'CPU'}) specs, got "
                f"({type(src).__name__}, {type(dst).__name__})"
            )
        if len(cpu.block_ids) != len(disk.block_hashes):
            raise ValueError(
                f"{len(cpu.block_ids)} CPU blocks for {len(disk.block_hashes)} disk keys"
            )
        num_rows = self._pages.shape[0]
        rows = [int(b) for b in cpu.block_ids]
        bad = [r for r in rows if not 0 <= r < num_rows]
        if bad:
            raise ValueError(f"CPU block ids {bad[:5]} outside 0..{num_rows - 1}")
        if not self.cpu_to_disk and len(set(rows)) != len(rows):
            raise ValueError("a load writes two blocks into one CPU block")
        slots = [int(b) for b in disk.block_ids] if self._slot_keys is not None else rows
        if len(slots) != len(rows):
            raise ValueError(f"{len(slots)} disk slots for {len(rows)} disk keys")
        return [(bytes(k), r, d) for k, r, d in zip(disk.block_hashes, rows, slots, strict=True)]

    def _run_block(self, job: _Job, key: bytes, row: int, slot: int) -> None:
        start = time.perf_counter()
        error: str | None = None
        try:
            if self.cpu_to_disk:
                self._free_slot(slot, key)
                self._store.write(key, self._pages[row])
                if self._slot_keys is not None:
                    self._slot_keys[slot] = key
            else:
                self._store.read_into(key, self._pages[row])
        except KvtierError as exc:
            error = str(exc)
        except Exception as exc:  # a bug, but it must not take the engine down
            logger.exception(
                "disk %s of block %s raised",
                "store" if self.cpu_to_disk else "load",
                key.hex()[:16],
            )
            error = f"block {key.hex()[:16]}: unexpected {exc!r}"
        end = time.perf_counter()
        with self._cv:
            job.started = start if job.started is None else min(job.started, start)
            job.ended = end if job.ended is None else max(job.ended, end)
            if error is None:
                job.bytes_moved += self._pages.shape[1]
            else:
                job.errors.append(error)
            job.pending -= 1
            if job.done:
                self._cv.notify_all()

    def _free_slot(self, slot: int, key: bytes) -> None:
        """Delete the block a reused disk slot held: the scheduler evicted it."""
        if self._slot_keys is None:
            return
        old = self._slot_keys.pop(slot, None)
        if old is not None and old != key:
            self._store.delete(old)

    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order; never blocks on I/O."""
        out = []
        with self._cv:
            while self._jobs and self._jobs[0].done:
                job = self._jobs.popleft()
                del self._by_id[job.job_id]
                out.append(job.result())
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs have finished (unknown or reported ids: no wait)."""
        ids = list(job_ids)
        with self._cv:
            self._cv.wait_for(lambda: all(self._by_id[j].done for j in ids if j in self._by_id))

    def shutdown(self) -> None:
        """Finish the queued jobs, then refuse new ones. Idempotent."""
        with self._cv:
            self._shut = True
        self._pool.shutdown(wait=True)


class CpuDiskOffloadingHandlers:
    """The CPU<->disk pair over one host page array and one ``DiskStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
            Rows 4 KiB aligned in address and size use ``O_DIRECT`` when the store
            does; other rows use buffered I/O.
        disk_store: the open store (its owner closes it).
        io_threads: blocks in flight per direction (``disk_io_threads``).
        slot_keys: when given, the handler remembers which key each disk slot (the
            ``block_ids`` of a ``DiskLoadStoreSpec``) holds, starting from this
            mapping (e.g. slot ``i`` = ``disk_store.recovered[i].key`` after a
            restart), and a store into a slot first deletes the key that slot held:
            the scheduler's evictions reach the disk with no message of their own.
            ``None``: no tracking; the owner deletes evicted keys itself
            (``DiskStore.delete``).
    """

    def __init__(
        self,
        cpu_pages: torch.Tensor,
        disk_store: DiskStore,
        io_threads: int = 4,
        slot_keys: Mapping[int, bytes] | None = None,
    ) -> None:
        if cpu_pages.dtype != torch.uint8 or cpu_pages.dim() != 2 or cpu_pages.device.type != "cpu":
            raise ValueError(
                f"cpu_pages must be a 2-D CPU uint8 tensor, got {cpu_pages.dtype} "
                f"{tuple(cpu_pages.shape)} on {cpu_pages.device}"
            )
        if not cpu_pages.is_contiguous():
            raise ValueError("cpu_pages must be contiguous")
        if io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {io_threads}")
        pages = cpu_pages.numpy()  # shares memory with the tensor
        self.cpu_to_disk_handler = CpuDiskHandler(
            cpu_to_disk=True,
            pages=pages,
            store=disk_store,
            io_threads=io_threads,
            slot_keys=None if slot_keys is None else dict(slot_keys),
        )
        self.disk_to_cpu_handler = CpuDiskHandler(
            cpu_to_disk=False, pages=pages, store=disk_store, io_threads=io_threads
        )

    def shutdown(self) -> None:
        """Shut both handlers down (each finishes its queued jobs first)."""
        self.cpu_to_disk_handler.shutdown()
        self.disk_to_cpu_handler.shutdown()
