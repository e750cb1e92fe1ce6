"""``OffloadingConnector``: the engine's connector over an ``OffloadingSpec``.

Runs in the engine process, called from the scheduler's thread. It is the per-request,
per-step logic of the design: lookup after the GPU prefix cache, load jobs, store jobs
after the forward pass, write-through to secondary tiers, and completions.

Engine pages are ``P`` tokens; offloaded blocks are ``f`` pages (``block_size_factor``).
Offloaded block ``j`` of a request covers pages ``j*f .. j*f+f-1`` and is named by the
key of its last page (keys are prefix-chained, so that key names the whole prefix)::

    pages        0   1   2   3 | 4   5   6   7 | 8 ...        f = 4
    blocks       ---- j=0 ---- | ---- j=1 ---- |
    GPU hits     [0 1 2]                               g = 3 pages
    load         skip 3 of j=0 ──► pages 3..7          ends on a block boundary

A load may start inside a block (``skip_count``) and always ends on a block boundary;
the engine's last prompt token is always recomputed, so the answer to (a) is capped
there. A load or promotion that fails means recompute: the handle completes with the
leading pages that did load, and the engine computes the rest.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.engine.connector_api import LoadHandle, OffloadStats
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.tiering import TieredManager, TierJob
from kvtier.spec import OffloadingSpec
from kvtier.specs import GPULoadStoreSpec, LoadStoreSpec

if TYPE_CHECKING:
    import torch

    from kvtier.engine.request import Request
    from kvtier.worker import OffloadingWorker, TransferResult


class _Kind(enum.Enum):
    LOAD = "load"
    STORE = "store"
    PROMOTE = "promote"
    WRITE = "write"


@dataclass(slots=True)
class _Load:
    """One request's load: promotions first (if any), then one CPU->GPU job."""

    handle: LoadHandle
    block_keys: list[BlockHash]
    gpu_block_ids: list[BlockId]
    skip: int
    from_secondary: dict[Medium, int] = field(default_factory=dict)
    promotions: set[int] = field(default_factory=set)
    failed: int = 0  # blocks whose promotion failed


@dataclass(frozen=True, slots=True)
class _Job:
    kind: _Kind
    block_hashes: tuple[BlockHash, ...]
    request_id: str | None = None
    load: _Load | None = None
    tier_job: TierJob | None = None


class OffloadingConnector:
    """Offloading for the reference engine, built from one ``OffloadingSpec``."""

    def __init__(self, spec: OffloadingSpec) -> None:
        self.spec = spec
        self.f = spec.block_size_factor
        self.policy = spec.config.store_policy
        self.manager = spec.get_manager()
        self.primary = (
            self.manager.primary if isinstance(self.manager, TieredManager) else self.manager
        )
        self.worker: OffloadingWorker | None = None
        self._ids = itertools.count()
        self._jobs: dict[int, _Job] = {}
        self._next_block: dict[str, int] = {}  # request -> first offloaded block not yet offered
        self._stores: dict[str, int] = {}  # request -> store jobs reading its pages
        self._finished: set[str] = set()  # finished requests waiting for their stores
        self._stats = _Counters()

    # -- engine points ----------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Sequence[torch.Tensor], block_size: int) -> None:
        self.worker = self.spec.get_worker(kv_caches)

    def get_num_external_hit_blocks(
        self, request: Request, block_keys: Sequence[BlockHash], num_gpu_hit_blocks: int
    ) -> int:
        f, g = self.f, num_gpu_hit_blocks
        keys = block_keys[f - 1 :: f]
        self.manager.touch(keys)
        self.primary.count_seen(keys[: g // f])  # served by the GPU: a reuse
        self._next_block[request.request_id] = 0
        j0 = g // f
        hit = self.manager.lookup(keys[j0:])
        last_loadable = (request.num_tokens - 1) // self.spec.geometry.gpu_block_size
        end = min((j0 + hit) * f, last_loadable // f * f)
        return max(0, end - g)

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        f = self.f
        g = request.num_computed_tokens // self.spec.geometry.gpu_block_size
        j0, j1 = g // f, (g + len(block_keys)) // f
        load = _Load(
            handle=LoadHandle(len(block_keys)),
            block_keys=request.block_keys[f - 1 :: f][j0:j1],
            gpu_block_ids=list(gpu_block_ids),
            skip=g - j0 * f,
        )
        if isinstance(self.manager, TieredManager):
            self._start_promotions(load)
        if not load.promotions:
            self._submit_load(load)
        return load.handle

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        if self.policy == "on_evict" or not block_keys:
            return
        rid, f = request.request_id, self.f
        full_pages = request.block_keys.index(block_keys[-1]) + 1
        start, end = self._next_block.get(rid, 0), full_pages // f
        if end <= start:
            return
        self._next_block[rid] = end
        keys = request.block_keys[f - 1 :: f]
        wanted = {keys[j]: j for j in range(start, end)}
        gpu_of = {keys[j]: request.block_table[j * f : (j + 1) * f] for j in range(start, end)}
        self._store(list(wanted), gpu_of, rid)

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        if self.policy != "on_evict":
            return
        job_id = self._store([block_key], {block_key: [gpu_block_id]}, None)
        if job_id is not None:
            assert self.worker is not None
            self.worker.wait([job_id])  # the engine reuses the page when this returns

    def poll(self) -> Sequence[str]:
        assert self.worker is not None
        if isinstance(self.manager, TieredManager):
            for tier_job in self.manager.prepare_writes():
                self._submit(
                    _Job(_Kind.WRITE, tier_job.block_hashes, tier_job=tier_job),
                    tier_job.src,
                    tier_job.dst,
                )
        released: list[str] = []
        for result in self.worker.get_finished():
            job = self._jobs.pop(result.job_id)
            self._finish(job, result, released)
        return released

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        rid = request.request_id
        self._next_block.pop(rid, None)
        if self._stores.get(rid):
            self._finished.add(rid)
            return True
        self._stores.pop(rid, None)
        return False

    def take_stats(self) -> OffloadStats:
        stats, self._stats = self._stats.freeze(), _Counters()
        return stats

    def flush(self) -> None:
        """Wait until every job in flight and every queued write-through is done.

        Call it between ``generate`` calls (the engine holds no finished request then).
        """
        assert self.worker is not None
        while True:
            self.poll()
            pending = self.manager.pending_writes if isinstance(self.manager, TieredManager) else 0
            if not self._jobs and not pending:
                return
            self.worker.wait(list(self._jobs))

    def close(self) -> None:
        """Flush, then release the handlers, the host slab and the disk store."""
        if self.worker is not None:
            self.flush()
        self.spec.shutdown()

    # -- internals --------------------------------------------------------------------

    def _store(
        self, keys: list[BlockHash], gpu_of: Mapping[BlockHash, Sequence[BlockId]], rid: str | None
    ) -> int | None:
        # All or nothing per call: when the whole run does not fit now, store the
        # longest leading part that does (a prefix's head is worth the most).
        wanted = len(keys)
        out = self.manager.prepare_store(keys)
        while out is None and len(keys) > 1:
            keys = keys[: len(keys) // 2]
            out = self.manager.prepare_store(keys)
        self._stats.refused_stores += wanted - (len(keys) if out is not None else 0)
        if out is None or not out.block_hashes_to_store:
            return None  # no room now, or nothing new
        gpu_ids = [b for key in out.block_hashes_to_store for b in gpu_of[key]]
        job = _Job(_Kind.STORE, out.block_hashes_to_store, request_id=rid)
        if rid is not None:
            self._stores[rid] = self._stores.get(rid, 0) + 1
        return self._submit(job, GPULoadStoreSpec(tuple(gpu_ids)), out.store_spec)

    def _start_promotions(self, load: _Load) -> None:
        assert isinstance(self.manager, TieredManager)
        keys = load.block_keys
        jobs = self.manager.prepare_promotion(keys)
        while jobs is None and len(keys) > 1:  # promote the longest head that fits
            keys = keys[: len(keys) // 2]
            jobs = self.manager.prepare_promotion(keys)
        if jobs is None:  # the CPU tier cannot make room: load what it holds
            return
        for tier_job in jobs:
            medium = tier_job.src.medium
            load.from_secondary[medium] = load.from_secondary.get(medium, 0) + len(
                tier_job.block_hashes
            )
            job = _Job(_Kind.PROMOTE, tier_job.block_hashes, load=load, tier_job=tier_job)
            load.promotions.add(self._submit(job, tier_job.src, tier_job.dst))

    def _submit_load(self, load: _Load) -> None:
        ready = 0
        for key in load.block_keys:
            if self.primary.state(key) is not BlockState.READY:
                break
            ready += 1
        pages = min(ready * self.f - load.skip, load.handle.num_blocks) if ready else 0
        self._stats.refused_loads += max(0, len(load.block_keys) - ready - load.failed)
        if pages <= 0:
            load.handle.complete(0)
            return
        keys = load.block_keys[:ready]
        cpu_spec = self.primary.prepare_load(keys)
        gpu_spec = GPULoadStoreSpec(tuple(load.gpu_block_ids[:pages]), skip_count=load.skip)
        self._submit(_Job(_Kind.LOAD, tuple(keys), load=load), cpu_spec, gpu_spec)

    def _submit(self, job: _Job, src: LoadStoreSpec, dst: LoadStoreSpec) -> int:
        assert self.worker is not None
        job_id = next(self._ids)
        self._jobs[job_id] = job
        self.worker.transfer_async(job_id, (src, dst))  # a refusal comes back as failed
        return job_id

    def _finish(self, job: _Job, result: TransferResult, released: list[str]) -> None:
        ok, n, s = result.success, len(job.block_hashes), self._stats
        if job.kind is _Kind.LOAD:
            assert job.load is not None
            self.primary.complete_load(job.block_hashes)
            load = job.load
            if ok:
                pages = min(n * self.f - load.skip, load.handle.num_blocks)
                s.loaded_blocks += n
                s.bytes_loaded += result.bytes_moved
                promoted = sum(load.from_secondary.values())
                for medium, count in load.from_secondary.items():
                    s.hit(medium, count)
                s.hit(self.primary.medium, n - promoted)
                load.handle.complete(pages)
            else:
                s.failed_loads += n
                load.handle.complete(0)
        elif job.kind is _Kind.STORE:
            self.manager.complete_store(job.block_hashes, success=ok)
            if ok:
                s.stored_blocks += n
                s.bytes_stored += result.bytes_moved
            else:
                s.failed_stores += n
            rid = job.request_id
            if rid is not None:
                self._stores[rid] -= 1
                if not self._stores[rid]:
                    del self._stores[rid]
                    if rid in self._finished:
                        self._finished.discard(rid)
                        released.append(rid)
        elif job.kind is _Kind.PROMOTE:
            assert isinstance(self.manager, TieredManager) and job.tier_job and job.load
            self.manager.complete_promotion(job.tier_job, ok)
            job.load.promotions.discard(result.job_id)
            if not ok:
                s.failed_loads += n
                job.load.failed += n
                job.load.from_secondary.clear()
            if not job.load.promotions:
                self._submit_load(job.load)
        else:
            assert isinstance(self.manager, TieredManager) and job.tier_job
            self.manager.complete_write(job.tier_job, ok)


class _Counters:
    """Mutable counters behind ``OffloadStats``."""

    def __init__(self) -> None:
        self.hits: dict[Medium, int] = {}
        self.loaded_blocks = self.stored_blocks = self.bytes_loaded = self.bytes_stored = 0
        self.failed_loads = self.failed_stores = self.refused_stores = self.refused_loads = 0

    def hit(self, medium: Medium, n: int) -> None:
        if n:
            self.hits[medium] = self.hits.get(medium, 0) + n

    def freeze(self) -> OffloadStats:
        return OffloadStats(
            hit_blocks=dict(self.hits),
            loaded_blocks=self.loaded_blocks,
            stored_blocks=self.stored_blocks,
            bytes_loaded=self.bytes_loaded,
            bytes_stored=self.bytes_stored,
            failed_loads=self.failed_loads,
            failed_stores=self.failed_stores,
            refused_stores=self.refused_stores,
            refused_loads=self.refused_loads,
        )
