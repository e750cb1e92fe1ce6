"""``PooledHandler``: a handler whose jobs run as tasks on a thread pool, reported in order.

Runs in the worker process. The disk handlers use it (the remote ones have one I/O
thread each, ``media.remote_loop``; they share ``host_pages`` and ``split_spec`` from
here): ``transfer_async`` validates a spec in the caller's thread (``_plan``) and
submits the job's tasks (one per block) to the direction's pool, so several reads or
writes are in flight (the system calls release the GIL). A job finishes when
all its tasks have; ``get_finished`` reports jobs in submission order even when the pool
finishes them out of order, each with success, bytes and time, and on failure what
failed and why. Nothing a job does raises out of the handler. In a forked child the
handler starts afresh (``media/forks``): a new pool and condition, the jobs unfinished
at the fork reported failed.
"""

from __future__ import annotations

import abc
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import KvtierError, TransferSpecError
from kvtier.load_store_specs import BlockIdsSpec, CPULoadStoreSpec, KeyedBlocksSpec
from kvtier.media.forks import renew_after_fork
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec

logger = logging.getLogger(__name__)

MAX_ERRORS_SHOWN = 3

Task = tuple[str, Callable[[], int]]
"""``(label, run)``: ``run()`` moves bytes and returns how many, or raises
``KvtierError`` (a failure of the job, reported with ``label``)."""


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
        error = f"{len(self.errors)} task(s) failed: {shown}" + (
            f"; {more} more" if more > 0 else ""
        )
        return TransferResult(self.job_id, False, 0, seconds, error)


class PooledHandler(OffloadingHandler):
    """One direction between host pages and a store; subclasses plan the tasks.

    Args:
        src_medium: where jobs read.
        dst_medium: where jobs write.
        io_threads: tasks in flight.
        thread_name: prefix of the pool's thread names.
    """

    def __init__(
        self, *, src_medium: Medium, dst_medium: Medium, io_threads: int, thread_name: str
    ) -> None:
        self.src_medium, self.dst_medium = src_medium, dst_medium
        self._io_threads, self._thread_name = io_threads, thread_name
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix=thread_name)
        self._cv = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._by_id: dict[int, _Job] = {}
        self._shut = False
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's pool threads are not there (its executor
        would queue tasks no thread runs) and a lock one held at the fork stays held.
        A new pool and condition; every job unfinished at the fork is reported failed
        (its tasks ran in the parent, in part or not at all)."""
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(self._io_threads, thread_name_prefix=self._thread_name)
        self._by_id = {job.job_id: job for job in self._jobs}  # ``_add`` may be half done
        for job in self._jobs:
            if not job.done:
                job.errors.append("handler forked: a parent's job")
                job.pending = 0

    @abc.abstractmethod
    def _plan(self, spec: TransferSpec) -> list[Task]:
        """The job's tasks; raises ``KvtierError``/``TypeError``/``ValueError`` if invalid."""

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Validate and submit; a refused job (False) is reported failed, in order."""
        try:
            tasks = self._plan(spec)
        except (KvtierError, TypeError, ValueError, AttributeError) as exc:
            return self._add(_Job(job_id, pending=0, refused=f"invalid transfer spec: {exc}"))
        job = _Job(job_id, pending=len(tasks))
        with self._cv:
            if self._shut:
                job.refused, job.pending = "handler is shut down", 0
                return self._add(job)
            self._add(job)
            submitted = 0
            try:
                for label, run in tasks:
                    self._pool.submit(self._run, job, label, run)
                    submitted += 1
            except RuntimeError as exc:  # interpreter shutdown: report, do not raise
                job.errors.append(f"not submitted: {exc}")
                job.pending -= len(tasks) - submitted
        return True

    def _add(self, job: _Job) -> bool:
        with self._cv:
            self._jobs.append(job)
            self._by_id[job.job_id] = job
        return job.refused is None

    def _run(self, job: _Job, label: str, run: Callable[[], int]) -> None:
        start = time.perf_counter()
        moved, error = 0, None
        try:
            moved = run()
        except KvtierError as exc:
            error = f"{label}: {exc}"
        except Exception as exc:  # a bug, but it must not take the engine down
            logger.exception("%s->%s %s raised", self.src_medium, self.dst_medium, label)
            error = f"{label}: unexpected {exc!r}"
        end = time.perf_counter()
        with self._cv:
            job.started = start if job.started is None else min(job.started, start)
            job.ended = end if job.ended is None else max(job.ended, end)
            job.bytes_moved += moved
            if error is not None:
                job.errors.append(error)
            job.pending -= 1
            if job.done:
                self._cv.notify_all()

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


def host_pages(cpu_pages: torch.Tensor, io_threads: int) -> np.ndarray:
    """The CPU tier's pages as a numpy view (shared memory), after checking them.

    Raises:
        ValueError: not a contiguous 2-D CPU ``uint8`` tensor, or ``io_threads < 1``.
    """
    if cpu_pages.dtype != torch.uint8 or cpu_pages.dim() != 2 or cpu_pages.device.type != "cpu":
        raise ValueError(
            f"cpu_pages must be a 2-D CPU uint8 tensor, got {cpu_pages.dtype} "
            f"{tuple(cpu_pages.shape)} on {cpu_pages.device}"
        )
    if not cpu_pages.is_contiguous():
        raise ValueError("cpu_pages must be contiguous")
    if io_threads < 1:
        raise ValueError(f"io_threads must be >= 1, got {io_threads}")
    return cpu_pages.numpy()


def split_spec(
    spec: TransferSpec, to_store: bool, keyed: type[KeyedBlocksSpec], num_rows: int
) -> tuple[list[int], KeyedBlocksSpec]:
    """Check a (CPU, keyed store) job either way; return its CPU rows and keyed spec.

    Raises:
        TransferSpecError: the specs are not ``(CPU, keyed)`` in the handler's
            direction, counts differ, a row is out of range, or a load writes a row twice.
    """
    src, dst = spec
    cpu, store = (src, dst) if to_store else (dst, src)
    if not isinstance(cpu, CPULoadStoreSpec) or not isinstance(store, keyed):
        want: Sequence[type[BlockIdsSpec]] = (
            (CPULoadStoreSpec, keyed) if to_store else (keyed, CPULoadStoreSpec)
        )
        raise TransferSpecError(
            f"takes ({want[0].__name__}, {want[1].__name__}), "
            f"got ({type(src).__name__}, {type(dst).__name__})"
        )
    if len(cpu.block_ids) != len(store.block_hashes):
        raise TransferSpecError(
            f"{len(cpu.block_ids)} CPU blocks for {len(store.block_hashes)} keys"
        )
    rows = [int(b) for b in cpu.block_ids]
    bad = [r for r in rows if not 0 <= r < num_rows]
    if bad:
        raise TransferSpecError(f"CPU block ids {bad[:5]} outside 0..{num_rows - 1}")
    if not to_store and len(set(rows)) != len(rows):
        raise TransferSpecError("a load writes two blocks into one CPU block")
    return rows, store
