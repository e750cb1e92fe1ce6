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
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from vllm.v1.kv_offload.base import LookupResult, RequestOffloadingContext
from vllm.v1.kv_offload.base import Medium as VllmMedium
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvtier import tiers
from kvtier.blocks import BlockHash, Medium
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError, KvtierError
from kvtier.integrations.vllm.checkpoint import checkpoint_digest
from kvtier.integrations.vllm.identity import storage_fingerprint
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, RemoteLoadStoreSpec
from kvtier.scheduler import TierManager
from kvtier.scheduler.discovery import Discovery
from kvtier.scheduler.manager import BlockState

logger = logging.getLogger(__name__)


def _fingerprint(spec: Any, row_bytes: int) -> bytes:
    """The storage fingerprint of whole chunk rows (every rank's bytes) of this engine."""
    config = spec.config
    return storage_fingerprint(
        config,
        layout=f"vllm-chunk-rows/{row_bytes}B",
        ranks="all-ranks",
        block_size=_block_size(spec),
        weights=checkpoint_digest(str(config.model.name)),
        identity=str(config.extra_config.get("model_identity", "")),
        engine="vllm-tiering",
    )


def _block_size(spec: Any) -> int:
    """Tokens per offloaded block (a chunk of vLLM blocks)."""
    config = spec.config
    return int(config.groups[0].tokens_per_block) * int(config.cache.blocks_per_chunk)


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
        from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

        cfg = OffloadingConfig.for_tier(tier_type, "disk_", tier_config)
        if cfg.disk_path is None:
            raise ConfigError("disk_path", f"is required for {tier_type}")
        num_blocks = tiers.disk_blocks(cfg, self.block_size_bytes)
        self.store = tiers.open_disk(cfg, self._fingerprint)
        recovered = tiers.recovered_keys([self.store], num_blocks)
        self.index = tiers.disk_tier(
            cfg, num_blocks, recovered, block_size=_block_size(offloading_spec), enable_events=False
        )
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
        from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers

        cfg = OffloadingConfig.for_tier(tier_type, "remote_", tier_config)
        if cfg.remote_url is None:
            raise ConfigError("remote_url", f"is required for {tier_type}")
        self.store = tiers.open_remote(cfg, self._fingerprint)
        self.index = tiers.remote_tier(
            cfg, block_size=_block_size(offloading_spec), enable_events=False
        )
        self._group = CpuRemoteOffloadingHandlers(
            self._pages, self.store, io_threads=cfg.remote_io_threads
        )
        self._store_handler = self._group.cpu_to_remote_handler
        self._load_handler = self._group.remote_to_cpu_handler
        self._discovery = Discovery(self.store)
        self._asked: set[BlockHash] = set()  # keys a check was started for

    def _lookup_absent(self, key: BlockHash) -> Any:
        """Ask Redis off this thread whether another engine stored ``key``: RETRY until
        the answer is in, then HIT (adopted into the index) or MISS. A stalled check
        (a hung server) is a MISS: vLLM is never held up by the network."""
        for found in self._discovery.answers():
            if found.outages == self.store.outages:
                self.index.adopt(found.keys)
        if self.index.state(key) is BlockState.READY:
            self._asked.discard(key)
            self.index.touch([key])
            return LookupResult.HIT
        if self._discovery.asking(key):
            return LookupResult.RETRY
        if key in self._asked:  # answered (not there, or no answer in time)
            self._asked.discard(key)
            return LookupResult.MISS
        self._discovery.ask([key])
        if not self._discovery.asking(key):  # not taken: too many checks in flight
            return LookupResult.MISS
        self._asked.add(key)
        return LookupResult.RETRY

    def has_pending_work(self) -> bool:
        """Jobs in flight, or an existence check still running (a finished one waits
        for the next lookup of its key and keeps nothing stepping)."""
        return super().has_pending_work() or self._discovery.in_flight > 0

    def shutdown(self) -> None:
        self._discovery.shutdown()
        super().shutdown()
        self.store.close()
