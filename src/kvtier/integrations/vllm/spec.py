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

KV cache groups: a hybrid model's groups (full attention, sliding window, chunked
local attention, Mamba state) all draw their GPU blocks from one pool of pages of one
size, so one CPU tier holds every group's blocks, each under vLLM's key for it (block
hash + group index), and a slab row holds one page of any group. vLLM's connector
decides which keys a hit needs, group by group (a windowed group only the blocks of its
window before the hit end); kvtier answers for each key, and its worker copies each
group's pages of a job in turn (``worker.plan_job``).

Storage identity: each rank's shards are stored under a fingerprint of the model
(name, KV dtype, a digest of its checkpoint's files -- ``checkpoint`` -- and the
optional ``model_identity`` key), the page size, the block size, the KV cache groups
(each group's layers and block size) and the parallel layout *with the rank and world
size*, so a rank never reads another's shard, and
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

from kvtier import tiers
from kvtier.blocks import Medium
from kvtier.errors import ConfigError
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.checkpoint import checkpoint_digest
from kvtier.integrations.vllm.identity import storage_fingerprint
from kvtier.integrations.vllm.manager import KvtierManager
from kvtier.integrations.vllm.region import HostRegion, RegionLayout, region_path
from kvtier.integrations.vllm.settings import VllmSettings
from kvtier.scheduler import TierManager

logger = logging.getLogger(__name__)


def describe_groups(config: Any) -> str:
    """vLLM's KV cache groups in words (what the log says at start-up): each group's
    index, layers, tokens per block and, where vLLM says (0.33), its window."""
    parts = []
    for g in config.groups:
        kind = ""
        if hasattr(g, "sliding_window_size_in_chunks"):  # vLLM 0.33
            window = g.sliding_window_size_in_chunks
            kind = (
                ", full attention"
                if window is None
                else f", a window of {window} offloaded block(s)"
            )
        layers = list(g.layer_names)
        shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
        parts.append(f"group {g.group_id} ({shown}; {g.tokens_per_block} tokens a block{kind})")
    return f"{len(parts)} KV cache group(s): " + "; ".join(parts)


def window_blocks(config: Any) -> int:
    """CPU blocks a request's windowed groups need beside its full-attention run: each
    window and one block more (a window ending mid-block). vLLM 0.33 says each group's
    window in offloaded blocks; 0.32 does not (0)."""
    windows = [getattr(g, "sliding_window_size_in_chunks", None) for g in config.groups]
    return sum(int(w) + 1 for w in windows if w is not None)


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
        if not config.groups:
            raise ConfigError("kv_connector_extra_config", "vLLM offloads no KV cache group")
        self.blocks_per_chunk = int(config.cache.blocks_per_chunk)
        # Tokens per offloaded block of the finest group (what kvtier's events report);
        # each group's own is in the storage fingerprint (``identity.group_layout``).
        self.block_size = min(int(g.tokens_per_block) for g in config.groups) * (
            self.blocks_per_chunk
        )
        self.settings = VllmSettings.from_extra_config(self.extra_config, self.block_size)
        self._weights: str | None = None  # the checkpoint digest, once needed
        cfg = self.settings.offloading
        par = config.parallel
        self.rank, self.world_size = int(par.rank), int(par.world_size)
        self.shard_bytes = int(config.worker_kv_bytes_per_block) * self.blocks_per_chunk
        if self.shard_bytes <= 0:
            raise ConfigError("kv_connector_extra_config", "vLLM reported no KV bytes per block")
        # Every rank's shard of a block lives in the shared region. Only the process
        # that will create it checks its size against free memory: in the others the
        # region already counts against it.
        self.region_path: Path = region_path(self.settings.shm_dir, str(config.engine_id))
        per_block = self.shard_bytes * self.world_size
        num_blocks = tiers.cpu_blocks(cfg, per_block, check=not self.region_path.exists())
        self.num_disk_blocks = 0
        if cfg.disk_path is not None:
            self.num_disk_blocks = tiers.disk_blocks(cfg, self.shard_bytes, stores=self.world_size)
        self.layout = RegionLayout(num_blocks, self.shard_bytes, self.world_size)
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
        logger.info("kvtier: offloading %s", describe_groups(self.config))
        region = HostRegion.open(self.region_path, self.layout)
        events = cfg.enable_events and self.kv_events_config.enable_kv_cache_events
        cpu = tiers.cpu_tier(
            cfg, self.layout.num_blocks, block_size=self.block_size, enable_events=events
        )
        disks: list[Any] = []
        remotes: list[Any] = []
        secondaries: list[TierManager] = []
        if cfg.disk_path is not None:
            disks = [
                tiers.open_disk(cfg, self._fingerprint(rank), stores=self.world_size)
                for rank in range(self.world_size)
            ]
            recovered = tiers.recovered_keys(disks, self.num_disk_blocks)
            logger.info("kvtier: disk tier at %s holds %d block(s)", cfg.disk_path, len(recovered))
            secondaries.append(
                tiers.disk_tier(
                    cfg,
                    self.num_disk_blocks,
                    recovered,
                    block_size=self.block_size,
                    enable_events=events,
                )
            )
        redis: TierManager | None = None
        if cfg.remote_url is not None:
            remotes = [
                tiers.open_remote(cfg, self._fingerprint(rank)) for rank in range(self.world_size)
            ]
            redis = tiers.remote_tier(cfg, block_size=self.block_size, enable_events=events)
            secondaries.append(redis)

        def close() -> None:
            for store in [*disks, *remotes]:
                store.close()
            region.unlink()
            region.close()

        if not secondaries:
            return KvtierManager(cpu, None, region, on_shutdown=close)
        from kvtier.integrations.vllm.mover import EveryRank, RankMover
        from kvtier.integrations.vllm.windows import WindowChecks

        mover = RankMover(
            [region.slab(r) for r in range(self.world_size)],
            disks=disks,
            remotes=remotes,
            disk_io_threads=cfg.disk_io_threads,
            remote_io_threads=cfg.remote_io_threads,
        )
        # Redis is shared with other engines: its own LRU evicts, never this engine. A
        # block is there for this engine when every rank's shard is.
        shared = {Medium.REMOTE: EveryRank(remotes)} if remotes else None
        tiered = tiers.tiering(cfg, cpu, secondaries, shared)
        windows = WindowChecks(EveryRank(remotes), redis) if redis is not None else None
        return KvtierManager(
            cpu,
            tiered,
            region,
            mover,
            on_shutdown=close,
            windows=windows,
            window_blocks=window_blocks(self.config),
        )

    def _fingerprint(self, rank: int) -> bytes:
        """Rank ``rank``'s storage fingerprint (the checkpoint digested once)."""
        if self._weights is None:
            self._weights = checkpoint_digest(str(self.config.model.name))
        return storage_fingerprint(
            self.config,
            layout=f"vllm-pages/{self.shard_bytes}B",
            ranks=f"rank{rank}",
            block_size=self.block_size,
            weights=self._weights,
            identity=self.settings.model_identity,
            engine="vllm",
        )

    # -- worker side ------------------------------------------------------------------

    def get_worker(self, kv_caches: Any) -> Any:
        """This rank's worker (built once): see ``KvtierWorker``. Runs on vLLM's CPU
        platform (host tensors) as on CUDA.

        Raises:
            ConfigError: (key ``kv_caches``) tensors kvtier cannot copy; for a model of
                several KV cache groups the message names them and vLLM's workaround.
        """
        if self._worker is None:
            from kvtier.integrations.vllm.worker import KvtierWorker

            region = HostRegion.open(self.region_path, self.layout)
            self._worker_region = region
            try:
                self._worker = KvtierWorker(
                    kv_caches,
                    region.slab(self.rank),
                    region.status()[self.rank],
                    self.blocks_per_chunk,
                )
            except ConfigError as e:
                if len(self.config.groups) == 1:
                    raise
                reason = str(e).removeprefix(f"config key {e.key!r}: ")
                raise ConfigError(
                    e.key,
                    f"{reason} -- the model has {describe_groups(self.config)}; vLLM's "
                    "--disable-hybrid-kv-cache-manager folds sliding-window layers into "
                    "one full-attention group (every layer then keeps every block: more "
                    "GPU memory)",
                ) from e
        return self._worker
