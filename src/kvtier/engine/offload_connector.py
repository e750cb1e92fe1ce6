"""``OffloadingConnector``: the reference engine's connector, over the two halves.

Runs in the engine process, called from the scheduler's thread. It adapts the
engine's connector points (``connector_api``) to the connector's two halves and
carries values between them, nothing else::

    engine points ─► ConnectorScheduler ── TransferJob ──► worker half (this process,
       (a)..(f)        (pure Python)    ◄─ TransferResult ─  or a child: WorkerProcess)
                 ◄── LoadDone / released ids

The scheduler half decides (``kvtier.connector.scheduler_half``); the worker half moves
bytes (``kvtier.connector.worker_half``). This module only keeps the engine's
``LoadHandle``s, sends each call's jobs on, and shows each finished job (its spec and
result) to the observers added with ``add_observer`` (metrics, failure counts) -- here,
in the engine's process, wherever the worker half runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvtier.blocks import BlockHash, BlockId
from kvtier.connector.scheduler_half import ConnectorScheduler
from kvtier.connector.stats import OffloadStats
from kvtier.engine.connector_api import LoadHandle
from kvtier.errors import ProtocolError
from kvtier.interrupts import critical
from kvtier.jobs import TransferResult, TransferSpec
from kvtier.offloading_spec import OffloadingSpec
from kvtier.scheduler.tiering import TieredManager

if TYPE_CHECKING:
    import torch

    from kvtier.connector.worker_half import WorkerHalf
    from kvtier.engine.request import Request

_FLUSH_POLL_S = 0.001
_LOST = "lost: the worker half never reported it (closing)"
_log = logging.getLogger(__name__)

TransferObserver = Callable[[TransferSpec | None, TransferResult], None]
"""Called with each finished job's spec (``None`` if it was sent before the observer was
added) and its result; see ``OffloadingConnector.add_observer``."""


class OffloadingConnector:
    """Offloading for the reference engine, built from one ``OffloadingSpec``.

    Args:
        spec: the validated configuration and the engine's geometry.
        worker_process: run the worker half in a child process (as a multi-process
            engine would) instead of in this one.
    """

    def __init__(self, spec: OffloadingSpec, worker_process: bool = False) -> None:
        self.spec = spec
        self.scheduler = ConnectorScheduler(
            spec.get_manager(),
            block_size_factor=spec.block_size_factor,
            gpu_block_size=spec.geometry.gpu_block_size,
            store_policy=spec.config.store_policy,
        )
        self.worker: WorkerHalf | None = None
        self.worker_process = worker_process
        self._handles: dict[str, LoadHandle] = {}
        self._observers: list[TransferObserver] = []
        self._specs: dict[int, TransferSpec] = {}  # jobs in flight, kept for observers

    @property
    def manager(self) -> TieredManager:
        """The scheduler half's manager (every tier)."""
        return self.scheduler.manager

    def add_observer(self, observer: TransferObserver) -> None:
        """Call ``observer(spec, result)`` for every finished job, in the engine's thread,
        before the scheduler half completes it (metrics and failure logs; it must not
        raise: what it raises is logged and dropped)."""
        self._observers.append(observer)

    # -- engine points ----------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Sequence[torch.Tensor], block_size: int) -> None:
        if self.worker_process:
            from kvtier.connector.worker_process import WorkerProcess

            self.spec.release_disk_store()  # the child opens (and locks) it
            self.worker = WorkerProcess(self.spec.config, self.spec.geometry, kv_caches)
        else:
            from kvtier.connector.worker_half import ConnectorWorker

            self.worker = ConnectorWorker.from_spec(self.spec, kv_caches)

    def get_num_external_hit_blocks(
        self, request: Request, block_keys: Sequence[BlockHash], num_gpu_hit_blocks: int
    ) -> int | None:
        with critical:
            return self.scheduler.num_external_hit_pages(
                request.request_id, block_keys, num_gpu_hit_blocks, request.num_tokens
            )

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        handle = LoadHandle(len(block_keys))
        first_page = request.num_computed_tokens // self.spec.geometry.gpu_block_size
        with critical:
            self._handles[request.request_id] = handle
            self.scheduler.start_load(
                request.request_id, request.block_keys, first_page, gpu_block_ids
            )
            self._send(write_through=False)
        return handle

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        if not block_keys:
            return
        full_pages = request.block_keys.index(block_keys[-1]) + 1
        with critical:
            self.scheduler.pages_full(
                request.request_id, request.block_keys, full_pages, request.block_table
            )
            self._send(write_through=False)

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        with critical:
            job_id = self.scheduler.gpu_evict(block_key, gpu_block_id)
            if job_id is not None:
                self._send(write_through=False)
        if job_id is not None:  # a wait may block: outside the section, a stop signal
            # ends it (the worker halves keep their own hand-overs whole; see
            # ``ThreadLane.wait`` and ``WorkerProcess``)
            self._worker().wait([job_id])  # the engine reuses the page when this returns

    def poll(self) -> Sequence[str]:
        with critical:
            return self._complete(self._worker().get_finished())

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        with critical:
            return self.scheduler.request_finished(request.request_id)

    def take_stats(self) -> OffloadStats:
        with critical:
            return self.scheduler.take_stats()

    def flush(self) -> None:
        """Wait until every job in flight and all background work is done.

        Call it between ``generate`` calls (the engine holds no finished request then).
        """
        self._drain(closing=False)

    def close(self) -> None:
        """Flush, then release the handlers, the host slab and the stores (also when
        the flush raises).

        A job the worker half has no result for once it was waited for is lost: an
        exception cut a hand-over in two (results taken and never completed, jobs taken
        and never submitted). Closing counts such jobs failed, with a warning, instead
        of waiting for them for ever: their blocks are dropped, never served. Only
        here: a job still running must not be failed while the tier lives (its slots
        would be reused under the copy), and the worker half's shutdown finishes every
        copy before the memory is released.
        """
        try:
            if self.worker is not None:
                self._drain(closing=True)
        finally:
            self.scheduler.shutdown()
            if self.worker is not None:
                self.worker.shutdown()
            self.spec.shutdown()

    # -- internals --------------------------------------------------------------------

    def _worker(self) -> WorkerHalf:
        if self.worker is None:
            raise ProtocolError("OffloadingConnector: register_kv_caches was not called")
        return self.worker

    def _drain(self, closing: bool) -> None:
        worker = self._worker()
        while True:
            self.poll()
            if not self.scheduler.has_pending_work:
                return
            in_flight = self.scheduler.jobs_in_flight
            if not in_flight:
                self.scheduler.manager.wait_discoveries(_FLUSH_POLL_S)
                continue
            worker.wait(in_flight)
            if closing:
                self.poll()
                lost = sorted(set(in_flight).intersection(self.scheduler.jobs_in_flight))
                if lost:
                    _log.warning(
                        "closing: %d job(s) never reported by the worker half (ids %s), "
                        "counted failed",
                        len(lost),
                        lost[:8],
                    )
                    with critical:
                        self._complete([TransferResult.failed(j, _LOST) for j in lost])

    def _complete(self, results: Sequence[TransferResult]) -> Sequence[str]:
        if self._observers:
            self._observe(results)
        progress = self.scheduler.on_finished(results)
        for load in progress.loads:
            self._handles.pop(load.request_id).complete(load.num_pages)
        self._send(write_through=True)
        return progress.released

    def _send(self, write_through: bool) -> None:
        jobs = self.scheduler.take_jobs(write_through)
        if jobs:
            if self._observers:
                self._specs.update((job.job_id, job.spec) for job in jobs)
            self._worker().submit(jobs)

    def _observe(self, results: Sequence[TransferResult]) -> None:
        for result in results:
            spec = self._specs.pop(result.job_id, None)
            for observer in self._observers:
                try:
                    observer(spec, result)
                except Exception:
                    _log.exception("transfer observer %r raised", observer)
