"""kvtier's disk and Redis tiers as secondary tiers of vLLM's own ``TieringOffloadingSpec``.

For vLLM >= 0.33 users who keep vLLM's CPU tier and add kvtier behind it::

    "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
    "secondary_tiers": [
      {"type": "KvtierDiskTier", "module_path": "kvtier.integrations.vllm",
       "disk_path": "/var/cache/kv", "disk_bytes_to_use": "200GiB"},
      {"type": "KvtierRedisTier", "module_path": "kvtier.integrations.vllm",
       "remote_url": "redis://cache:6379/0"}]

Runs in vLLM's scheduler process, under vLLM's tiering manager (which calls every
method with its lock held, from the scheduler thread or its tier-poll thread). vLLM
gives a tier a memoryview of its CPU tier (one row per chunk, every rank's bytes) and
asks it to copy rows out (``submit_store``) and back (``submit_load``); kvtier's disk
and Redis handlers do the copies on their thread pools, and each tier keeps kvtier's
index of what it holds (``TierManager``: capacity, policy, pins).

What kvtier adds over vLLM's fs tier: a hard byte capacity with eviction by kvtier's
policies, and a checksum on every block (a block that fails it is deleted, its load
fails and the tier forgets it, so vLLM's next lookup misses and recomputes). vLLM has
no Redis / Valkey tier; this is one, shared by every engine of the same model and
layout, with lookups of blocks other engines wrote answered ``RETRY`` while an
existence check runs off the scheduler thread.

Storage identity: a chunk row holds every rank's bytes, so the fingerprint names the
model (name, dtype, its checkpoint's digest -- ``checkpoint`` -- and the optional
``model_identity`` key of vLLM's ``kv_connector_extra_config``), the row size, the
block size and the whole parallel layout (world size).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from vllm.v1.kv_offload.base import LookupResult, RequestOffloadingContext
from vllm.v1.kv_offload.base import Medium as VllmMedium
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvtier.blocks import BlockHash, Medium
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError, KvtierError
from kvtier.integrations.vllm.checkpoint import checkpoint_digest
from kvtier.keys import ModelFingerprint, root_key
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, RemoteLoadStoreSpec
from kvtier.scheduler import TierManager, make_policy
from kvtier.scheduler.manager import BlockState

logger = logging.getLogger(__name__)


def _tier_settings(tier: str, prefix: str, raw: dict[str, Any]) -> OffloadingConfig:
    """Validate a tier's keys with kvtier's own rules (``ConfigError`` names the key)."""
    known = sorted(f.name for f in fields(OffloadingConfig) if f.name.startswith(prefix))
    for key in raw:
        if key not in known:
            raise ConfigError(key, f"unknown key of {tier}; known keys: {', '.join(known)}")
    return OffloadingConfig.from_dict({"cpu_bytes_to_use": 1, **raw})


def _fingerprint(spec: Any, row_bytes: int) -> bytes:
    config = spec.config
    par = config.parallel
    block = int(config.groups[0].tokens_per_block) * int(config.cache.blocks_per_chunk)
    identity = config.extra_config.get("model_identity", "")
    fp = ModelFingerprint(
        model_id=str(config.model.name),
        dtype=str(config.model.dtype),
        kv_layout=f"vllm-chunk-rows/{row_bytes}B",
        block_size=block,
        parallel=(
            f"tp{par.tp_size}/pp{par.pp_size}/pcp{par.pcp_size}/dcp{par.dcp_size}"
            f"/world{par.world_size}/all-ranks"
        ),
        weights=checkpoint_digest(str(config.model.name)),
        extra=(("engine", "vllm-tiering"), ("model_identity", str(identity))),
    )
    return bytes(root_key(fp))


@dataclass(slots=True)
class _Job:
    vllm_id: int
    keys: list[BlockHash]
    store: bool
    pinned: bool = False


class _KvtierTier(SecondaryTierManager):  # type: ignore[misc]
    """The plumbing both tiers share: kvtier's index, a handler per direction, jobs."""

    medium: ClassVar[VllmMedium] = VllmMedium.STORAGE
    kvtier_medium: ClassVar[Medium]

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: Any = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if locality is not None:
            self.locality = locality
        rows = np.frombuffer(primary_kv_view, dtype=np.uint8)
        row_bytes = self.block_size_bytes
        self._pages = torch.from_numpy(rows.reshape(-1, row_bytes))
        self._fingerprint = _fingerprint(offloading_spec, row_bytes)
        self._jobs: dict[int, _Job] = {}
        self._done: list[Any] = []
        self._ids = itertools.count()
        self.index: TierManager
        self._store_handler: Any
        self._load_handler: Any
        self._group: Any

    def _keyed(self, keys: list[BlockHash], slots: Any) -> Any:
        spec_type = DiskLoadStoreSpec if self.kvtier_medium is Medium.DISK else RemoteLoadStoreSpec
        return spec_type.for_blocks(keys, slots)

    def lookup(self, key: Any, req_context: Any) -> Any:
        k = BlockHash(bytes(key))
        state = self.index.state(k)
        if state is BlockState.READY:
            self.index.touch([k])
            return LookupResult.HIT
        if state is BlockState.STORING:
            return LookupResult.RETRY
        return self._lookup_absent(k)

    def _lookup_absent(self, key: BlockHash) -> Any:
        return LookupResult.MISS

    def touch(self, keys: Any, req_context: Any) -> None:
        self.index.touch([BlockHash(bytes(k)) for k in keys])

    def submit_store(self, job_metadata: Any) -> None:
        """Write primary rows out; keys already held are skipped, room is made by policy."""
        keys = [BlockHash(bytes(k)) for k in job_metadata.keys]
        chunk_of = dict(zip(keys, (int(c) for c in job_metadata.chunk_ids), strict=True))
        out = self.index.prepare_store(keys)
        if out is None or not out.block_hashes_to_store:
            self._done.append(JobResult(job_id=job_metadata.job_id, success=out is not None))
            return
        todo = list(out.block_hashes_to_store)
        cpu = CPULoadStoreSpec(tuple(chunk_of[k] for k in todo))  # type: ignore[misc]
        dst = self._keyed(todo, out.store_spec.block_ids)  # type: ignore[attr-defined]
        if out.block_hashes_evicted and self.kvtier_medium is Medium.DISK:
            # The disk follows the index: the store deletes what was evicted for it.
            dst = dataclasses.replace(dst, evicted_hashes=tuple(out.block_hashes_evicted))
        self._submit(self._store_handler, _Job(job_metadata.job_id, todo, True), (cpu, dst))

    def submit_load(self, job_metadata: Any) -> None:
        """Read blocks into primary rows (pinned here until the copy is done)."""
        keys = [BlockHash(bytes(k)) for k in job_metadata.keys]
        try:
            src = self.index.prepare_load(keys)
        except KvtierError as exc:  # no longer READY here: the promotion fails
            logger.warning("kvtier %s: load of a block it no longer holds: %s", self.tier_type, exc)
            self._done.append(JobResult(job_id=job_metadata.job_id, success=False))
            return
        src = self._keyed(keys, src.block_ids)
        cpu = CPULoadStoreSpec(tuple(int(c) for c in job_metadata.chunk_ids))  # type: ignore[misc]
        job = _Job(job_metadata.job_id, keys, False, pinned=True)
        self._submit(self._load_handler, job, (src, cpu))

    def _submit(self, handler: Any, job: _Job, spec: Any) -> None:
        job_id = next(self._ids)
        self._jobs[job_id] = job
        handler.transfer_async(job_id, spec)

    def get_finished_jobs(self) -> Iterable[Any]:
        done, self._done = self._done, []
        for handler in (self._store_handler, self._load_handler):
            for result in handler.get_finished():
                job = self._jobs.pop(result.job_id)
                if job.store:
                    self.index.complete_store(job.keys, result.success)
                else:
                    self.index.complete_load(job.keys)
                    if not result.success:  # unreadable (checksum, gone): a miss from now on
                        self.index.discard(job.keys)
                if not result.success:
                    logger.warning("kvtier %s: job failed: %s", self.tier_type, result.error)
                done.append(
                    JobResult(
                        job_id=job.vllm_id,
                        success=result.success,
                        transfer_time=result.seconds,
                        transfer_bytes=result.bytes_moved,
                    )
                )
        return done

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._done)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        ids = list(self._jobs)
        self._store_handler.wait(ids)
        self._load_handler.wait(ids)

    def shutdown(self) -> None:
        self._group.shutdown()


class KvtierDiskTier(_KvtierTier):
    """kvtier's verified, bounded disk tier behind vLLM's CPU tier.

    Keys (besides vLLM's ``type``, ``module_path``, ``backpressure``, ``locality``):
    ``disk_path`` and ``disk_bytes_to_use`` (required), ``disk_eviction_policy``,
    ``disk_io_threads``, ``disk_fsync``, ``disk_direct_io``, as in kvtier's config.
    """

    kvtier_medium: ClassVar[Medium] = Medium.DISK

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: Any = None,
        **tier_config: Any,
    ) -> None:
        super().__init__(
            offloading_spec, primary_kv_view, tier_type, backpressure_detector, locality
        )
        from kvtier.media.disk import DiskStore
        from kvtier.media.disk_layout import block_file_size
        from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

        cfg = _tier_settings(tier_type, "disk_", tier_config)
        if cfg.disk_path is None or cfg.disk_bytes_to_use is None:
            raise ConfigError("disk_path", f"is required for {tier_type}")
        num_blocks = cfg.disk_bytes_to_use // block_file_size(self.block_size_bytes)
        if num_blocks < 1:
            raise ConfigError("disk_bytes_to_use", "holds no block of this engine")
        Path(cfg.disk_path).mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = DiskStore.open(
            cfg.disk_path,
            self._fingerprint,
            cfg.disk_bytes_to_use,
            fsync=cfg.disk_fsync,
            direct_io=cfg.disk_direct_io,
        )
        self.index = TierManager(
            medium=Medium.DISK,
            num_blocks=num_blocks,
            block_size=1,
            policy=make_policy(cfg.disk_eviction_policy, num_blocks),
        )
        recovered = [b.key for b in self.store.recovered][-num_blocks:]
        self.index.restore([BlockHash(k) for k in recovered])
        self._group = CpuDiskOffloadingHandlers(
            self._pages, self.store, io_threads=cfg.disk_io_threads
        )
        self._store_handler = self._group.cpu_to_disk_handler
        self._load_handler = self._group.disk_to_cpu_handler

    def shutdown(self) -> None:
        super().shutdown()
        self.store.close()


class KvtierRedisTier(_KvtierTier):
    """kvtier's Redis / Valkey tier behind vLLM's CPU tier, shared between engines.

    Keys: ``remote_url`` (required) and kvtier's other ``remote_*`` keys.
    """

    kvtier_medium: ClassVar[Medium] = Medium.REMOTE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: Any = None,
        **tier_config: Any,
    ) -> None:
        super().__init__(
            offloading_spec, primary_kv_view, tier_type, backpressure_detector, locality
        )
        from kvtier.media.circuit_breaker import Backoff
        from kvtier.media.redis_client import RemoteOptions
        from kvtier.media.remote import RemoteStore
        from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers

        cfg = _tier_settings(tier_type, "remote_", tier_config)
        if cfg.remote_url is None:
            raise ConfigError("remote_url", f"is required for {tier_type}")
        self.store = RemoteStore.open(
            self._fingerprint,
            RemoteOptions(
                url=cfg.remote_url,
                cluster=cfg.remote_cluster,
                timeout_s=cfg.remote_timeout_s,
                password_env=cfg.remote_password_env,
                ttl_s=cfg.remote_ttl_s,
                max_connections=2 * cfg.remote_io_threads + 2,
                tls_ca_file=cfg.remote_tls_ca_file,
                backoff=Backoff(base_s=cfg.remote_backoff_s),
            ),
        )
        n = cfg.remote_index_blocks
        self.index = TierManager(
            medium=Medium.REMOTE, num_blocks=n, block_size=1, policy=make_policy("lru", n)
        )
        self._group = CpuRemoteOffloadingHandlers(
            self._pages, self.store, io_threads=cfg.remote_io_threads
        )
        self._store_handler = self._group.cpu_to_remote_handler
        self._load_handler = self._group.remote_to_cpu_handler
        self._checker = ThreadPoolExecutor(1, "kvtier-redis-tier-check")
        self._checks: dict[BlockHash, Future[bool]] = {}

    def _lookup_absent(self, key: BlockHash) -> Any:
        """Ask Redis off this thread whether another engine stored ``key``: RETRY until
        the answer is in, then HIT (adopted into the index) or MISS."""
        future = self._checks.get(key)
        if future is None:
            self._checks[key] = self._checker.submit(self._exists, bytes(key))
            return LookupResult.RETRY
        if not future.done():
            return LookupResult.RETRY
        del self._checks[key]
        if future.result() and self.index.adopt([key]):
            return LookupResult.HIT
        return LookupResult.MISS

    def _exists(self, key: bytes) -> bool:
        try:
            return bool(self.store.exists_many([key])[0])
        except KvtierError:
            return False

    def has_pending_work(self) -> bool:
        """Jobs in flight, or an existence check still running (a finished one waits
        for the next lookup of its key and keeps nothing stepping)."""
        running = any(not f.done() for f in self._checks.values())
        return super().has_pending_work() or running

    def shutdown(self) -> None:
        self._checker.shutdown(wait=True, cancel_futures=True)
        super().shutdown()
        self.store.close()
