"""Tier jobs for every rank's shard: CPU tier <-> disk / Redis, off the scheduler thread.

Runs in vLLM's scheduler process (EngineCore), next to kvtier's manager. The CPU tier
lives in the shared region (``region``), so the manager's process can read and write
each rank's slab itself: a promotion (disk or Redis -> CPU) completes before vLLM is
told the block hit, and a write-through (CPU -> disk or Redis) never involves vLLM.

Each rank has its own kvtier handlers over its own slab and its own stores, whose
storage fingerprint names the rank and the world size: rank ``r``'s shard of a block
is a separate file or value, and a rank never reads another's. One ``TierJob`` runs as
one kvtier job per rank (kvtier's disk and Redis handlers, each on its thread pool);
it succeeds only when every rank's part did.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.media.disk import DiskStore
from kvtier.media.remote import RemoteStore
from kvtier.scheduler.tiering import TierJob
from kvtier.worker import OffloadingWorker


class EveryRank:
    """Every rank's Redis store as one shared store: a block is there for this engine
    only when every rank's shard is (``SharedStore`` for the tiering's discovery)."""

    def __init__(self, stores: Sequence[RemoteStore]) -> None:
        self.stores = list(stores)

    def exists_many(self, keys: Sequence[bytes]) -> list[bool]:
        """One batched check per rank; may raise ``KvtierError`` (no hits then)."""
        held = [True] * len(keys)
        for store in self.stores:
            held = [a and b for a, b in zip(held, store.exists_many(keys), strict=True)]
        return held

    @property
    def outages(self) -> int:
        """Outages of any rank's store (after one, shards may be gone)."""
        return sum(store.outages for store in self.stores)


@dataclass(slots=True)
class _Pending:
    job: TierJob
    waiting: int
    ok: bool = True
    errors: list[str] | None = None


class RankMover:
    """Runs ``TierJob``s for every rank. Not thread-safe: the scheduler thread calls it.

    Args:
        slabs: each rank's slab, ``(num_cpu_blocks, shard_bytes)`` uint8.
        disks: each rank's disk store (empty: no disk tier).
        remotes: each rank's remote store (empty: no remote tier).
        disk_io_threads: disk reads/writes in flight per direction and rank.
        remote_io_threads: Redis batches in flight per direction and rank.
    """

    def __init__(
        self,
        slabs: Sequence[np.ndarray],
        disks: Sequence[DiskStore] = (),
        remotes: Sequence[RemoteStore] = (),
        disk_io_threads: int = 4,
        remote_io_threads: int = 2,
    ) -> None:
        from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
        from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers

        self._workers: list[OffloadingWorker] = []
        self._groups: list[CpuDiskOffloadingHandlers | CpuRemoteOffloadingHandlers] = []
        for rank, slab in enumerate(slabs):
            pages = torch.from_numpy(slab)
            worker = OffloadingWorker()
            if disks:
                # Evictions reach the disk in the store specs (``evicted_hashes``).
                disk = CpuDiskOffloadingHandlers(pages, disks[rank], io_threads=disk_io_threads)
                worker.register_handler(Medium.CPU, Medium.DISK, disk.cpu_to_disk_handler)
                worker.register_handler(Medium.DISK, Medium.CPU, disk.disk_to_cpu_handler)
                self._groups.append(disk)
            if remotes:
                remote = CpuRemoteOffloadingHandlers(
                    pages, remotes[rank], io_threads=remote_io_threads
                )
                worker.register_handler(Medium.CPU, Medium.REMOTE, remote.cpu_to_remote_handler)
                worker.register_handler(Medium.REMOTE, Medium.CPU, remote.remote_to_cpu_handler)
                self._groups.append(remote)
            self._workers.append(worker)
        self._ids = itertools.count()
        self._pending: dict[int, _Pending] = {}

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet returned by ``poll``."""
        return len(self._pending)

    def submit(self, job: TierJob) -> int:
        """Start ``job`` on every rank; returns its id. Never blocks on I/O."""
        job_id = next(self._ids)
        self._pending[job_id] = _Pending(job, waiting=len(self._workers))
        for worker in self._workers:
            worker.transfer_async(job_id, (job.src, job.dst))
        return job_id

    def poll(self) -> list[tuple[int, TierJob, bool, str | None]]:
        """Jobs every rank has finished: ``(id, job, success, first error)``."""
        for worker in self._workers:
            for result in worker.get_finished():
                pending = self._pending[result.job_id]
                pending.waiting -= 1
                if not result.success:
                    pending.ok = False
                    pending.errors = [*(pending.errors or []), result.error or "failed"]
        done = [(i, p) for i, p in self._pending.items() if p.waiting == 0]
        for job_id, _ in done:
            del self._pending[job_id]
        return [(i, p.job, p.ok, p.errors[0] if p.errors else None) for i, p in done]

    def drain(self) -> None:
        """Block until every submitted job has finished on every rank."""
        for worker in self._workers:
            worker.wait(list(self._pending))

    def shutdown(self) -> None:
        """Finish queued jobs, then stop every handler."""
        for group in self._groups:
            group.shutdown()
