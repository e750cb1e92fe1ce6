"""``KvtierOffloadingSpec``: kvtier as a vLLM offloading spec, loaded by module path.

vLLM builds a spec once in its scheduler process (EngineCore: ``get_manager``) and once
in each worker process (``get_worker``), from the same ``OffloadingConfig``. Load it
with::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.integrations.vllm", "cpu_bytes_to_use": "8GiB"}}'

Sizes, derived once here and the same in every process: an offloaded block is
``blocks_per_chunk`` GPU pages; one rank's shard of it is ``worker_kv_bytes_per_block *
blocks_per_chunk`` bytes; the CPU tier holds ``cpu_bytes_to_use // (shard * world_size)``
blocks (every rank's shard of a block lives in the shared region). The disk budget is
split evenly between the ranks' stores.

Storage identity: each rank's shards are stored under a fingerprint of the model
(name, KV dtype, a digest of its checkpoint's files -- ``checkpoint`` -- and the
optional ``model_identity`` key), the page size, the block size and the parallel
layout *with the rank and world size*, so a rank never reads another's shard, and
an engine of another layout or model never reads either. Keys inside are vLLM's own
``OffloadKey`` (block hash + group index); vLLM's default sha256 block hashes are the
same in every process and engine (with a non-cryptographic
``prefix_caching_hash_algo``, set ``PYTHONHASHSEED`` to share disk and Redis between
engines).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kvtier.blocks import BlockHash, Medium
from kvtier.errors import ConfigError
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.checkpoint import checkpoint_digest
from kvtier.integrations.vllm.manager import KvtierManager
from kvtier.integrations.vllm.region import HostRegion, RegionLayout, region_path
from kvtier.integrations.vllm.settings import VllmSettings
from kvtier.keys import ModelFingerprint, root_key
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.tiering import TieredManager

logger = logging.getLogger(__name__)


def storage_fingerprint(
    config: Any, shard_bytes: int, block_size: int, rank: int, *, weights: str, identity: str
) -> bytes:
    """The digest naming rank ``rank``'s shards of this engine's blocks in disk and Redis.

    ``weights``: the checkpoint's digest (``checkpoint.checkpoint_digest``); ``identity``:
    the user's ``model_identity`` key (``""`` when not given).
    """
    par = config.parallel
    fp = ModelFingerprint(
        model_id=str(config.model.name),
        dtype=str(config.model.dtype),
        kv_layout=f"vllm-pages/{shard_bytes}B",
        block_size=block_size,
        parallel=(
            f"tp{par.tp_size}/pp{par.pp_size}/pcp{par.pcp_size}/dcp{par.dcp_size}"
            f"/world{par.world_size}/rank{rank}"
        ),
        weights=weights,
        extra=(
            ("engine", "vllm"),
            ("tokens_per_hash", str(config.cache.tokens_per_hash)),
            ("model_identity", identity),
        ),
    )
    return bytes(root_key(fp))


class KvtierOffloadingSpec(compat.OffloadingSpec):  # type: ignore[misc]
    """kvtier's CPU tier (with disk and Redis behind it) for vLLM. See the module doc.

    Raises:
        ConfigError: a key of ``kv_connector_extra_config`` is invalid (named), or the
            engine's KV cache is one kvtier cannot offload.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """kvtier's ``vllm:kv_offload_kvtier_*`` metrics (see ``metrics``)."""
        from kvtier.integrations.vllm.metrics import definitions

        return definitions()

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if len(config.groups) != 1:
            raise ConfigError(
                "kv_connector_extra_config",
                f"the model has {len(config.groups)} KV cache groups; kvtier's vLLM spec "
                "offloads models with one (full attention)",
            )
        self.blocks_per_chunk = int(config.cache.blocks_per_chunk)
        self.block_size = int(config.groups[0].tokens_per_block) * self.blocks_per_chunk
        self.settings = VllmSettings.from_extra_config(self.extra_config, self.block_size)
        self._weights: str | None = None  # the checkpoint digest, once needed
        cfg = self.settings.offloading
        par = config.parallel
        self.rank, self.world_size = int(par.rank), int(par.world_size)
        self.shard_bytes = int(config.worker_kv_bytes_per_block) * self.blocks_per_chunk
        if self.shard_bytes <= 0:
            raise ConfigError("kv_connector_extra_config", "vLLM reported no KV bytes per block")
        per_block = self.shard_bytes * self.world_size
        num_blocks = cfg.cpu_bytes_to_use // per_block
        if num_blocks < 1:
            raise ConfigError(
                "cpu_bytes_to_use",
                f"{cfg.cpu_bytes_to_use} bytes hold no block of {per_block} bytes "
                f"({self.world_size} rank(s) x {self.shard_bytes}); give at least {per_block}",
            )
        self.layout = RegionLayout(num_blocks, self.shard_bytes, self.world_size)
        self.region_path: Path = region_path(self.settings.shm_dir, str(config.engine_id))
        self._manager: KvtierManager | None = None
        self._worker: Any = None
        self._worker_region: HostRegion | None = None

    @property
    def num_cpu_blocks(self) -> int:
        return self.layout.num_blocks

    # -- scheduler side ---------------------------------------------------------------

    def get_manager(self) -> KvtierManager:
        """The scheduler side (built once): see ``KvtierManager``."""
        if self._manager is None:
            self._manager = self._build_manager()
        return self._manager

    def _build_manager(self) -> KvtierManager:
        cfg = self.settings.offloading
        region = HostRegion.open(self.region_path, self.layout)
        events = cfg.enable_events and self.kv_events_config.enable_kv_cache_events
        threshold = cfg.store_threshold
        cpu = CPUOffloadingManager(
            num_blocks=self.layout.num_blocks,
            block_size=self.block_size,
            eviction_policy=cfg.eviction_policy,
            enable_events=events,
            store_threshold=threshold,
        )
        disks: list[Any] = []
        remotes: list[Any] = []
        secondaries: list[TierManager] = []
        if cfg.disk_path is not None:
            disks, disk_tier = self._open_disk(events)
            secondaries.append(disk_tier)
        if cfg.remote_url is not None:
            remotes = [self._open_remote(rank) for rank in range(self.world_size)]
            secondaries.append(
                TierManager(
                    medium=Medium.REMOTE,
                    num_blocks=cfg.remote_index_blocks,
                    block_size=self.block_size,
                    policy=make_policy("lru", cfg.remote_index_blocks),
                    enable_events=events,
                )
            )

        def close() -> None:
            for store in [*disks, *remotes]:
                store.close()
            region.unlink()
            region.close()

        if not secondaries:
            return KvtierManager(cpu, None, region, on_shutdown=close)
        from kvtier.integrations.vllm.mover import RankMover

        mover = RankMover(
            [region.slab(r) for r in range(self.world_size)],
            disks=disks,
            remotes=remotes,
            disk_io_threads=cfg.disk_io_threads,
            remote_io_threads=cfg.remote_io_threads,
        )
        # Redis is shared with other engines: its own LRU evicts, never this engine.
        shared = {Medium.REMOTE: remotes[0]} if remotes else None
        tiered = TieredManager(
            cpu, secondaries, max_pending_writes=cfg.max_pending_writes, shared=shared
        )
        return KvtierManager(cpu, tiered, region, mover, remotes, on_shutdown=close)

    def _open_disk(self, events: bool) -> tuple[list[Any], TierManager]:
        """Each rank's disk store, and one index of the blocks every rank holds."""
        from kvtier.media.disk import DiskStore
        from kvtier.media.disk_layout import block_file_size

        cfg = self.settings.offloading
        assert cfg.disk_path is not None and cfg.disk_bytes_to_use is not None
        per_rank = cfg.disk_bytes_to_use // self.world_size
        num_blocks = per_rank // block_file_size(self.shard_bytes)
        if num_blocks < 1:
            raise ConfigError(
                "disk_bytes_to_use",
                f"{per_rank} bytes per rank hold no block file of "
                f"{block_file_size(self.shard_bytes)} bytes",
            )
        Path(cfg.disk_path).mkdir(parents=True, exist_ok=True, mode=0o700)
        stores = [
            DiskStore.open(
                cfg.disk_path,
                self._fingerprint(rank),
                per_rank,
                fsync=cfg.disk_fsync,
                direct_io=cfg.disk_direct_io,
            )
            for rank in range(self.world_size)
        ]
        # A block is on disk when every rank's shard is; lone shards are deleted.
        held = [set(s.keys()) for s in stores]
        complete = set.intersection(*held)
        for store, keys in zip(stores, held, strict=True):
            for key in keys - complete:
                store.delete(key)
        recovered = [b.key for b in stores[0].recovered if b.key in complete][-num_blocks:]
        tier = TierManager(
            medium=Medium.DISK,
            num_blocks=num_blocks,
            block_size=self.block_size,
            policy=make_policy(cfg.disk_eviction_policy, num_blocks),
            enable_events=events,
        )
        tier.restore([BlockHash(k) for k in recovered])
        logger.info("kvtier: disk tier at %s holds %d block(s)", cfg.disk_path, len(recovered))
        return stores, tier

    def _fingerprint(self, rank: int) -> bytes:
        """Rank ``rank``'s storage fingerprint (the checkpoint digested once)."""
        if self._weights is None:
            self._weights = checkpoint_digest(str(self.config.model.name))
        return storage_fingerprint(
            self.config,
            self.shard_bytes,
            self.block_size,
            rank,
            weights=self._weights,
            identity=self.settings.model_identity,
        )

    def _open_remote(self, rank: int) -> Any:
        from kvtier.media.circuit_breaker import Backoff
        from kvtier.media.redis_client import RemoteOptions
        from kvtier.media.remote import RemoteStore

        cfg = self.settings.offloading
        assert cfg.remote_url is not None
        options = RemoteOptions(
            url=cfg.remote_url,
            cluster=cfg.remote_cluster,
            timeout_s=cfg.remote_timeout_s,
            password_env=cfg.remote_password_env,
            ttl_s=cfg.remote_ttl_s,
            max_connections=2 * cfg.remote_io_threads + 2,
            tls_ca_file=cfg.remote_tls_ca_file,
            backoff=Backoff(base_s=cfg.remote_backoff_s),
        )
        fp = self._fingerprint(rank)
        return RemoteStore.open(fp, options)

    # -- worker side ------------------------------------------------------------------

    def get_worker(self, kv_caches: Any) -> Any:
        """This rank's worker (built once): see ``KvtierWorker``. Runs on vLLM's CPU
        platform (host tensors) as on CUDA."""
        if self._worker is None:
            from kvtier.integrations.vllm.worker import KvtierWorker

            region = HostRegion.open(self.region_path, self.layout)
            self._worker_region = region
            self._worker = KvtierWorker(
                kv_caches,
                region.slab(self.rank),
                region.status()[self.rank],
                self.blocks_per_chunk,
            )
        return self._worker
