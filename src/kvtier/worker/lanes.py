"""Lanes: where a handler's jobs run, one after another, off the caller's thread.

A lane takes *enqueue functions* and reports each job once, in submission order.

* ``CudaLane`` (a GPU is present): the function runs in the caller's thread but only
  *enqueues* copies on a dedicated CUDA stream; events around it say when the job is
  done and how long it took. A function may return a ``pagecopy.Deferred``: its
  ``finish`` (host-side work on the copied bytes) runs in ``poll`` once the end event
  has fired, before the job is reported. With ``wait_for_compute`` the copy stream
  first waits on an event recorded on the caller's current stream, so a store never
  copies a block before the forward pass that writes it has finished.
* ``ThreadLane`` (CPU tensors stand in for GPU memory): one worker thread runs the
  functions in submission order. The thread stands in for the stream; the queue
  hand-off orders the caller's earlier writes before the copy, the CPU analogue of
  waiting for the compute stream. A caller blocked in ``wait`` runs the queued
  functions itself while the thread is not running one (still one at a time, in
  order), which saves the hand-off's thread switches where someone waits anyway.

Either way a function that raises, and a job submitted with an ``error``, become a
failed ``TransferResult``; nothing is raised to the caller.

A ``ThreadLane`` survives ``os.fork``: in the child it has new locks (the parent's
worker thread is not there, and a lock it held at the fork would stay held), reports
the jobs queued or running at the fork failed, and starts a worker thread at the
child's first submit. A ``CudaLane`` does nothing: CUDA cannot be used
in a child forked after it was initialised.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvtier.interrupts import critical
from kvtier.media.forks import renew_after_fork
from kvtier.worker.handler import TransferResult
from kvtier.worker.pagecopy import Deferred

EnqueueFn = Callable[[], tuple[int, Any]]
"""Runs (or enqueues) one job's copies; returns ``(bytes moved, objects to keep alive
until the copies are done)``."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class ThreadLane:
    """One worker thread running jobs in submission order (CPU stand-in for a stream).

    A caller blocked in ``wait`` does not sit idle: when the worker thread is not in
    the middle of a job, the caller runs the queued jobs itself, in order, up to the
    ones it waits for (one *runner* at a time, whichever thread holds ``_runner``).
    That saves the two thread switches of a hand-off (~20-40 us on the development
    VM, as long as a small job's copy) exactly where a caller waits for it.

    Two conditions on the lane's one lock: the worker thread sleeps on ``_queued``
    (a job queued, or the lane closed; ``submit`` notifies it), callers in ``wait``
    on ``_reported`` (a job reported, or one queued while no one runs). A job's end
    wakes only callers: an idle worker thread woken there would only take the GIL
    from the caller that ran the job. The worker woken by a submit whose job a
    waiting caller takes first finds the queue empty and sleeps again; that wake
    takes the GIL from the caller for a moment, which a small waited job pays (tens
    of microseconds on a loaded 2-core machine, ``docs/decisions.md``).
    """

    def __init__(self, name: str) -> None:
        """Start the worker thread ``name``."""
        self._lock = threading.Lock()
        self._reported = threading.Condition(self._lock)
        self._queued = threading.Condition(self._lock)
        self._queue: deque[tuple[int, EnqueueFn | None, str | None]] = deque()
        self._runner = threading.Lock()  # held while a job runs: jobs never overlap
        self._done: deque[TransferResult] = deque()
        self._in_flight: set[int] = set()
        self._closed = False
        self._name = name
        self._thread: threading.Thread | None = None
        self._start_worker()
        renew_after_fork(self)

    def _start_worker(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def submit(self, job_id: int, fn: EnqueueFn | None, error: str | None = None) -> None:
        """Queue a job (``fn=None`` with an ``error``: report it failed, in order).

        A closed lane runs nothing: a job submitted after ``close`` is reported
        failed, at once when every earlier job is reported, else queued as a refusal
        behind them (``close`` reports it), so reports stay in submission order.
        """
        with self._lock:
            if self._closed and not self._in_flight:
                self._done.append(TransferResult.failed(job_id, error or "lane is closed"))
                return
            if self._closed:  # closing, earlier jobs still to report: refused in turn
                fn, error = None, error or "lane is closed"
            if self._thread is None:  # the first job of a forked child
                self._start_worker()
            self._queue.append((job_id, fn, error))  # before ``_in_flight`` (``_after_fork``)
            self._in_flight.add(job_id)
            self._queued.notify()
            self._reported.notify_all()

    def _run_next(self) -> bool:
        """Run the oldest queued job, if any; the caller holds ``_runner``."""
        with self._lock:
            if not self._queue:
                return False
            job_id, fn, error = self._queue.popleft()
        try:
            if fn is None:
                result = TransferResult.failed(job_id, error or "refused")
            else:
                start = time.perf_counter()
                nbytes, _ = fn()
                result = TransferResult(job_id, True, nbytes, time.perf_counter() - start)
        except Exception as exc:
            result = TransferResult.failed(job_id, _describe(exc))
        except BaseException as exc:  # e.g. KeyboardInterrupt in a waiting caller
            result = TransferResult.failed(job_id, _describe(exc))
            raise  # the job is still reported (finally), so no wait hangs on it
        finally:
            with self._lock:
                self._done.append(result)
                self._in_flight.discard(job_id)
                self._reported.notify_all()
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                # a waiting caller may take the job between the wake and this check
                while not self._queue:
                    if self._closed:
                        return  # closed with nothing queued: everything has run
                    self._queued.wait()
            with self._runner:
                self._run_next()

    def poll(self) -> list[TransferResult]:
        """Jobs finished since the last poll, in submission order."""
        with self._lock:
            out = list(self._done)
            self._done.clear()
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until none of ``job_ids`` is queued or running; runs queued jobs
        itself (in order) while the worker thread is not running one."""
        wanted = set(job_ids)
        while True:
            with self._lock:
                if not wanted & self._in_flight:
                    return
            # A stop signal (``kvtier.interrupts``) waits until the job taken is run
            # and reported and the runner is free: cut between the pop and the report,
            # the job would stay in flight, and every later wait on it would hang.
            with critical:
                if self._runner.acquire(blocking=False):
                    try:
                        ran = self._run_next()
                    finally:
                        self._runner.release()
                    if ran:
                        continue
            with self._lock:  # the worker thread runs a job: wait for it to report
                self._reported.wait_for(
                    lambda: (
                        not wanted & self._in_flight
                        or (bool(self._queue) and not self._runner.locked())
                    )
                )

    def close(self) -> None:
        """Run what is queued, then stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queued.notify_all()
            self._reported.notify_all()
        if self._thread is not None:
            self._thread.join()
        # a caller in ``wait`` may still run the last job (the worker thread found the
        # queue empty and left), and a job submitted while closing is queued (refused)
        # behind the earlier ones: closing returns once every queued job is reported
        # and none runs
        with self._runner:
            while self._run_next():
                pass

    def _after_fork(self) -> None:
        """In a child forked from this process (``media/forks``), before anything else
        runs there: new locks and conditions; the jobs queued or running at the fork are
        reported failed (they ran in the parent, in part or not at all, and their
        results are the parent's), after the reports already due; no worker thread
        until the next submit."""
        self._lock = threading.Lock()
        self._reported = threading.Condition(self._lock)
        self._queued = threading.Condition(self._lock)
        self._runner = threading.Lock()
        queued = [job_id for job_id, _, _ in self._queue]
        reported = {result.job_id for result in self._done}
        # in flight, neither queued nor reported: the one job running (``submit`` queues
        # a job before it marks it in flight, so a half-submitted job is in the queue)
        cut_off = sorted(self._in_flight - set(queued) - reported) + queued
        for job_id in cut_off:
            self._done.append(TransferResult.failed(job_id, "lane forked: a parent's job"))
        self._queue.clear()
        self._in_flight.clear()
        self._thread = None


@dataclass(slots=True)
class _CudaJob:
    job_id: int
    start: Any  # torch.cuda.Event, or None when the job never ran
    end: Any
    nbytes: int
    keep_alive: Any
    error: str | None


class CudaLane:
    """Jobs enqueued on one CUDA stream; finished when their end event has fired."""

    def __init__(self, device: torch.device, wait_for_compute: bool) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        self._wait_for_compute = wait_for_compute
        self._jobs: deque[_CudaJob] = deque()

    def submit(self, job_id: int, fn: EnqueueFn | None, error: str | None = None) -> None:
        """Enqueue a job's copies on the lane's stream (returns before they run)."""
        if fn is None:
            self._jobs.append(_CudaJob(job_id, None, None, 0, None, error or "refused"))
            return
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        if self._wait_for_compute:
            self._stream.wait_event(torch.cuda.current_stream(self._device).record_event())
        try:
            with torch.cuda.stream(self._stream):
                start.record(self._stream)
                nbytes, keep = fn()
                end.record(self._stream)
        except Exception as exc:
            self._jobs.append(_CudaJob(job_id, None, None, 0, None, _describe(exc)))
            return
        self._jobs.append(_CudaJob(job_id, start, end, nbytes, keep, None))

    def poll(self) -> list[TransferResult]:
        """Jobs at the head of the queue whose copies are done, in submission order."""
        out: list[TransferResult] = []
        while self._jobs:
            job = self._jobs[0]
            seconds = 0.0
            if job.end is not None:
                try:
                    if not job.end.query():
                        break
                    seconds = job.start.elapsed_time(job.end) / 1e3
                    if isinstance(job.keep_alive, Deferred):
                        job.keep_alive.finish()  # host side of the job (pagecopy)
                except Exception as exc:  # an asynchronous CUDA error surfaces here
                    job.error, job.end = _describe(exc), None
            self._jobs.popleft()
            if job.error is not None:
                out.append(TransferResult.failed(job.job_id, job.error))
            else:
                out.append(TransferResult(job.job_id, True, job.nbytes, seconds))
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs' copies are done."""
        wanted = set(job_ids)
        for job in list(self._jobs):
            if job.job_id in wanted and job.end is not None:
                job.end.synchronize()

    def close(self) -> None:
        """Wait for everything enqueued."""
        self._stream.synchronize()
