"""CPU <-> remote offloading: one handler each way over a ``RemoteStore``, each with one
I/O thread (``RemoteLoop``) multiplexing ``io_threads`` connections.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and queues the job's values on the direction's loop, which pipelines them over
its non-blocking connections (a few requests outstanding on each) and never blocks the
caller. ``get_finished`` reports jobs in submission order, each with per-job success
and, on failure, why. Nothing a job does raises out of the handler: a dead or slow
Redis, a miss and a corrupt value all become a failed job, and the scheduler
recomputes.

Loads and stores have separate loops, so background write-through never queues a load
(which a request waits for) behind it.

After a failed load, the destination CPU pages of the blocks that were not verified
hits are zeroed (the others of the job hold good bytes); the scheduler drops the whole
job's blocks. The ``block_ids`` of a ``RemoteLoadStoreSpec`` (slots of the scheduler's
index) are not used here: a remote value is named by its key alone, and the server's
own LRU, not the handler, removes values (see ``docs/remote.md``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import KvtierError
from kvtier.load_store_specs import RemoteLoadStoreSpec
from kvtier.media.forks import renew_after_fork
from kvtier.media.remote import ReadOutcome, RemoteStore
from kvtier.media.remote_loop import BatchResult, Op, RemoteLoop
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec
from kvtier.worker.thread_pool_handler import host_pages, split_spec


def _describe_misses(keys: list[bytes], outcomes: tuple[ReadOutcome, ...]) -> str:
    missed = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.MISS]
    corrupt = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.CORRUPT]
    sealed = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.UNDECRYPTABLE]
    parts = []
    if missed:
        parts.append(f"{len(missed)} missed (evicted, expired or never stored)")
    if corrupt:
        parts.append(f"{len(corrupt)} failed verification (deleted)")
    if sealed:
        parts.append(f"{len(sealed)} undecryptable (deleted)")
    first = (missed + corrupt + sealed)[0].hex()[:16]
    lost = len(missed) + len(corrupt) + len(sealed)
    return f"{lost} of {len(keys)} block(s) not loaded: " + (", ".join(parts) + f"; first {first}")


@dataclass(eq=False, slots=True)
class _Waiter:
    """One ``wait`` call: how many of its jobs have not ended (under the condition)."""

    left: int = 0


@dataclass(slots=True)
class _Job:
    """A job in flight (its result set once, under the handler's condition)."""

    job_id: int
    result: TransferResult | None = None
    waiters: list[_Waiter] = field(default_factory=list)  # ``wait`` calls it is in


class CpuRemoteHandler(OffloadingHandler):
    """CPU->remote (stores) or remote->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuRemoteOffloadingHandlers``. In a forked child the jobs in flight at the fork
    are reported failed (their I/O stayed with the parent's thread).
    """

    def __init__(
        self, *, cpu_to_remote: bool, pages: np.ndarray, store: RemoteStore, io_threads: int
    ) -> None:
        media = (Medium.CPU, Medium.REMOTE) if cpu_to_remote else (Medium.REMOTE, Medium.CPU)
        self.src_medium, self.dst_medium = media
        self.cpu_to_remote = cpu_to_remote
        self._pages = pages
        self._store = store
        verb = "store" if cpu_to_remote else "load"
        self._verb = verb
        self._loop = RemoteLoop(store, connections=io_threads, name=f"kvtier-remote-{verb}")
        self._cv = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._by_id: dict[int, _Job] = {}
        self._shut = False
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh condition; the jobs in flight fail (the threads
        that waited for them are not in the child)."""
        self._cv = threading.Condition()
        for job in self._jobs:
            job.waiters.clear()
            if job.result is None:
                job.result = TransferResult.failed(
                    job.job_id, "in flight at a fork: its I/O stayed with the parent process"
                )

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Validate and queue; a refused job (False) is reported failed, in order."""
        job = _Job(job_id)
        try:
            rows, remote = split_spec(
                spec, self.cpu_to_remote, RemoteLoadStoreSpec, self._pages.shape[0]
            )
            keys = [bytes(k) for k in remote.block_hashes]
            names = [self._store.redis_key(k) for k in keys]  # checks each key's length
        except (KvtierError, TypeError, ValueError, AttributeError) as exc:
            job.result = TransferResult.failed(job_id, f"invalid transfer spec: {exc}")
        with self._cv:
            if job.result is None and self._shut:
                job.result = TransferResult.failed(job_id, "handler is shut down")
            self._jobs.append(job)
            self._by_id[job_id] = job
            if job.result is not None:
                return False
            nbytes = len(rows) * int(self._pages.shape[1])
            op = Op.STORE if self.cpu_to_remote else Op.LOAD
            pages = [self._pages[r] for r in rows]
            self._loop.submit(op, keys, pages, lambda r: self._done(job, keys, nbytes, r), names)
        return True

    def _done(self, job: _Job, keys: list[bytes], nbytes: int, r: BatchResult) -> None:
        """The loop's report of a job (in the loop's thread)."""
        error = None if r.error is None else f"remote {self._verb}: {r.error}"
        if error is None and any(o is not ReadOutcome.HIT for o in r.outcomes):
            error = f"remote {self._verb}: " + _describe_misses(keys, r.outcomes)
        if error is None:
            result = TransferResult(job.job_id, True, nbytes, r.seconds)
        else:
            result = TransferResult(job.job_id, False, 0, r.seconds, error)
        with self._cv:
            if job.result is None:
                job.result = result
            done = False
            for waiter in job.waiters:
                waiter.left -= 1
                done = done or not waiter.left
            job.waiters.clear()
            if done:  # a ``wait`` whose last job this was: woken once, not per job
                self._cv.notify_all()

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
        """Block until the given jobs have finished (unknown or reported ids: no wait).

        The caller is woken once, when the last of them ends, not as each one does: a
        wake-up per job costs the loop's thread a futex call and the GIL handed to the
        waiting thread and back."""
        with self._cv:
            waiter = _Waiter()
            for job_id in job_ids:
                job = self._by_id.get(job_id)
                if job is not None and job.result is None:
                    job.waiters.append(waiter)
                    waiter.left += 1
            try:
                while waiter.left:
                    self._cv.wait()
            finally:
                if waiter.left:  # interrupted: no job still counts it
                    for job in self._jobs:
                        if waiter in job.waiters:
                            job.waiters.remove(waiter)

    def shutdown(self) -> None:
        """Finish the queued jobs, then refuse new ones; ends the I/O thread. Idempotent."""
        with self._cv:
            self._shut = True
        self._loop.close()


class CpuRemoteOffloadingHandlers:
    """The CPU<->remote pair over one host page array and one ``RemoteStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
        remote_store: the store (its owner closes it); give it at least
            ``2 * io_threads + 1`` connections (``RemoteOptions.max_connections``: one
            left for its own commands, EXISTS, DEL, PING).
        io_threads: connections per direction (``remote_io_threads``), multiplexed
            by that direction's one I/O thread.
    """

    def __init__(self, cpu_pages: torch.Tensor, remote_store: RemoteStore, io_threads: int = 2):
        pages = host_pages(cpu_pages, io_threads)
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
