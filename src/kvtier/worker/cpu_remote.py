"""CPU <-> remote offloading: one handler each way over a ``RemoteStore`` and a thread pool.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and hands the whole job to the direction's thread pool as one task: one
pipelined batch (``RemoteStore.write_many`` / ``read_many_into``), one round trip per
``batch_bytes``. ``io_threads`` jobs are in flight per direction, each on its own
connection. ``get_finished`` reports jobs in submission order even when the pool
finishes them out of order, each with per-job success and, on failure, why. Nothing a
job does raises out of the handler: a dead or slow Redis, a miss and a corrupt value
all become a failed job, and the scheduler recomputes.

Loads and stores have separate pools, so background write-through never queues a load
(which a request waits for) behind it.

After a failed load, the destination CPU pages of the blocks that failed are zeroed
(the others of the job hold good bytes); the scheduler drops the whole job's blocks.
The ``block_ids`` of a ``RemoteLoadStoreSpec`` (slots of the scheduler's index) are not
used here: a remote value is named by its key alone, and the server's own LRU, not
the handler, removes values (see ``docs/remote.md``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import KvtierError
from kvtier.media.remote import ReadOutcome, RemoteStore
from kvtier.specs import CPULoadStoreSpec, RemoteLoadStoreSpec
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Job:
    """A job in flight; ``result`` is set once it has finished (guarded by the condition)."""

    job_id: int
    result: TransferResult | None = None


def _describe_misses(keys: list[bytes], outcomes: list[ReadOutcome]) -> str:
    missed = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.MISS]
    corrupt = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.CORRUPT]
    parts = []
    if missed:
        parts.append(f"{len(missed)} missed (evicted, expired or never stored)")
    if corrupt:
        parts.append(f"{len(corrupt)} failed verification (deleted)")
    first = (missed + corrupt)[0].hex()[:16]
    return f"{len(missed) + len(corrupt)} of {len(keys)} block(s) not loaded: " + (
        ", ".join(parts) + f"; first {first}"
    )


class CpuRemoteHandler(OffloadingHandler):
    """CPU->remote (stores) or remote->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuRemoteOffloadingHandlers``.
    """

    def __init__(
        self, *, cpu_to_remote: bool, pages: np.ndarray, store: RemoteStore, io_threads: int
    ) -> None:
        self.cpu_to_remote = cpu_to_remote
        self.src_medium, self.dst_medium = (
            (Medium.CPU, Medium.REMOTE) if cpu_to_remote else (Medium.REMOTE, Medium.CPU)
        )
        self._pages = pages
        self._store = store
        direction = "store" if cpu_to_remote else "load"
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix=f"kvtier-remote-{direction}")
        self._cv = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._by_id: dict[int, _Job] = {}
        self._shut = False

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Validate and submit; a refused job (False) is reported failed, in order."""
        try:
            keys, rows = self._plan(spec)
        except (KvtierError, TypeError, ValueError, AttributeError) as exc:
            return self._refuse(job_id, f"invalid transfer spec: {exc}")
        with self._cv:
            if self._shut:
                return self._refuse(job_id, "handler is shut down")
            job = _Job(job_id)
            self._jobs.append(job)
            self._by_id[job_id] = job
            try:
                self._pool.submit(self._run_job, job, keys, rows)
            except RuntimeError as exc:  # interpreter shutdown: report, do not raise
                job.result = TransferResult.failed(job_id, f"not submitted: {exc}")
        return True

    def _refuse(self, job_id: int, why: str) -> bool:
        with self._cv:
            job = _Job(job_id, TransferResult.failed(job_id, why))
            self._jobs.append(job)
            self._by_id[job_id] = job
        return False

    def _plan(self, spec: TransferSpec) -> tuple[list[bytes], list[int]]:
        src, dst = spec
        cpu, remote = (src, dst) if self.cpu_to_remote else (dst, src)
        if not isinstance(cpu, CPULoadStoreSpec) or not isinstance(remote, RemoteLoadStoreSpec):
            names = ("CPU", "REMOTE") if self.cpu_to_remote else ("REMOTE", "CPU")
            raise TypeError(
                f"{self.src_medium}->{self.dst_medium} takes ({names[0]}, {names[1]}) specs, "
                f"got ({type(src).__name__}, {type(dst).__name__})"
            )
        if len(cpu.block_ids) != len(remote.block_hashes):
            raise ValueError(
                f"{len(cpu.block_ids)} CPU blocks for {len(remote.block_hashes)} remote keys"
            )
        num_rows = self._pages.shape[0]
        rows = [int(b) for b in cpu.block_ids]
        bad = [r for r in rows if not 0 <= r < num_rows]
        if bad:
            raise ValueError(f"CPU block ids {bad[:5]} outside 0..{num_rows - 1}")
        if not self.cpu_to_remote and len(set(rows)) != len(rows):
            raise ValueError("a load writes two blocks into one CPU block")
        keys = [bytes(k) for k in remote.block_hashes]
        for k in keys:
            self._store.redis_key(k)  # checks the key's length
        return keys, rows

    def _run_job(self, job: _Job, keys: list[bytes], rows: list[int]) -> None:
        start = time.perf_counter()
        error: str | None = None
        pages = [self._pages[r] for r in rows]
        try:
            if self.cpu_to_remote:
                self._store.write_many(keys, pages)
            else:
                outcomes = self._store.read_many_into(keys, pages)
                if any(o is not ReadOutcome.HIT for o in outcomes):
                    error = _describe_misses(keys, outcomes)
        except KvtierError as exc:
            error = str(exc)
        except Exception as exc:  # a bug, but it must not take the engine down
            logger.exception("remote %s of job %d raised", self._verb, job.job_id)
            error = f"unexpected {exc!r}"
            if not self.cpu_to_remote:
                for page in pages:
                    page[:] = 0
        seconds = time.perf_counter() - start
        if error is None:
            result = TransferResult(job.job_id, True, len(rows) * self._pages.shape[1], seconds)
        else:
            result = TransferResult(job.job_id, False, 0, seconds, f"remote {self._verb}: {error}")
        with self._cv:
            job.result = result
            self._cv.notify_all()

    @property
    def _verb(self) -> str:
        return "store" if self.cpu_to_remote else "load"

    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order; never blocks on I/O."""
        out = []
        with self._cv:
            while self._jobs and self._jobs[0].result is not None:
                job = self._jobs.popleft()
                del self._by_id[job.job_id]
                assert job.result is not None
                out.append(job.result)
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs have finished (unknown or reported ids: no wait)."""
        ids = list(job_ids)
        with self._cv:
            self._cv.wait_for(
                lambda: all(self._by_id[j].result is not None for j in ids if j in self._by_id)
            )

    def shutdown(self) -> None:
        """Finish the queued jobs, then refuse new ones. Idempotent."""
        with self._cv:
            self._shut = True
        self._pool.shutdown(wait=True)


class CpuRemoteOffloadingHandlers:
    """The CPU<->remote pair over one host page array and one ``RemoteStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
        remote_store: the store (its owner closes it); give it at least
            ``2 * io_threads`` connections (``RemoteOptions.max_connections``).
        io_threads: jobs in flight per direction (``remote_io_threads``).
    """

    def __init__(self, cpu_pages: torch.Tensor, remote_store: RemoteStore, io_threads: int = 2):
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
        self.cpu_to_remote_handler = CpuRemoteHandler(
            cpu_to_remote=True, pages=pages, store=remote_store, io_threads=io_threads
        )
        self.remote_to_cpu_handler = CpuRemoteHandler(
            cpu_to_remote=False, pages=pages, store=remote_store, io_threads=io_threads
        )

    def shutdown(self) -> None:
        """Shut both handlers down (each finishes its queued jobs first)."""
        self.cpu_to_remote_handler.shutdown()
        self.remote_to_cpu_handler.shutdown()
