"""``OffloadingConnector``: the reference engine's connector, over the two halves.

Runs in the engine process, called from the scheduler's thread. It adapts the
engine's connector points (``connector_api``) to the connector's two halves and
carries values between them, nothing else::

    engine points ─► ConnectorScheduler ── TransferJob ──► worker half (this process,
       (a)..(f)        (pure Python)    ◄─ TransferResult ─  or a child: WorkerProcess)
                 ◄── LoadDone / released ids

The scheduler half decides (``kvtier.connector.scheduler_half``); the worker half moves
bytes (``kvtier.connector.worker_half``). This module only keeps the engine's
``LoadHandle``s and sends each call's jobs on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtier.blocks import BlockHash, BlockId
from kvtier.connector.scheduler_half import ConnectorScheduler
from kvtier.connector.stats import OffloadStats
from kvtier.engine.connector_api import LoadHandle
from kvtier.errors import ProtocolError
from kvtier.spec import OffloadingSpec

if TYPE_CHECKING:
    import torch

    from kvtier.connector.worker_half import WorkerHalf
    from kvtier.engine.request import Request

_FLUSH_POLL_S = 0.001


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
        return self.scheduler.num_external_hit_pages(
            request.request_id, block_keys, num_gpu_hit_blocks, request.num_tokens
        )

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        handle = LoadHandle(len(block_keys))
        self._handles[request.request_id] = handle
        first_page = request.num_computed_tokens // self.spec.geometry.gpu_block_size
        self.scheduler.start_load(request.request_id, request.block_keys, first_page, gpu_block_ids)
        self._send(write_through=False)
        return handle

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        if not block_keys:
            return
        full_pages = request.block_keys.index(block_keys[-1]) + 1
        self.scheduler.pages_full(
            request.request_id, request.block_keys, full_pages, request.block_table
        )
        self._send(write_through=False)

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        job_id = self.scheduler.gpu_evict(block_key, gpu_block_id)
        if job_id is not None:
            self._send(write_through=False)
            self._worker().wait([job_id])  # the engine reuses the page when this returns

    def poll(self) -> Sequence[str]:
        progress = self.scheduler.on_finished(self._worker().get_finished())
        for load in progress.loads:
            self._handles.pop(load.request_id).complete(load.num_pages)
        self._send(write_through=True)
        return progress.released

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        return self.scheduler.request_finished(request.request_id)

    def take_stats(self) -> OffloadStats:
        return self.scheduler.take_stats()

    def flush(self) -> None:
        """Wait until every job in flight and all background work is done.

        Call it between ``generate`` calls (the engine holds no finished request then).
        """
        worker = self._worker()
        while True:
            self.poll()
            if not self.scheduler.has_pending_work:
                return
            in_flight = self.scheduler.jobs_in_flight
            if in_flight:
                worker.wait(in_flight)
            else:
                self.scheduler.manager.wait_discoveries(_FLUSH_POLL_S)

    def close(self) -> None:
        """Flush, then release the handlers, the host slab and the stores."""
        if self.worker is not None:
            self.flush()
        self.scheduler.shutdown()
        if self.worker is not None:
            self.worker.shutdown()
        self.spec.shutdown()

    # -- internals --------------------------------------------------------------------

    def _worker(self) -> WorkerHalf:
        if self.worker is None:
            raise ProtocolError("OffloadingConnector: register_kv_caches was not called")
        return self.worker

    def _send(self, write_through: bool) -> None:
        jobs = self.scheduler.take_jobs(write_through)
        if jobs:
            self._worker().submit(jobs)
