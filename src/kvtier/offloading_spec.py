"""``OffloadingSpec``: one validated configuration builds both sides.

The scheduler half calls ``get_manager()`` (pure Python); each worker half calls
``get_worker(kv_caches)`` (imports torch). Either may come first, and each may run in
a process of its own with its own spec. Sizes are derived here, once, in the
constructor: how many offloaded blocks the CPU budget holds, how many block files the
disk budget holds, and how many bytes each really takes. The tiers themselves are
built by ``kvtier.tiers``, as for every engine.

With a disk tier, the scheduler's disk index is rebuilt from what the directory
already holds (blocks of this model and block size only), coldest first, once. The
disk handlers keep no index: store jobs name the keys to write and to delete. The
directory is opened (and locked) once per process; a scheduler whose worker half runs
elsewhere lets it go (``release_disk_store``) once it has read the index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier import tiers
from kvtier.blocks import BlockHash, Medium
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.keys import ModelFingerprint, root_key
from kvtier.scheduler.tiering import SharedStore, TieredManager

if TYPE_CHECKING:
    import torch

    from kvtier.media.disk import DiskStore
    from kvtier.media.remote import RemoteStore
    from kvtier.worker import OffloadingWorker


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """What the spec must know of the engine's KV cache.

    Attributes:
        gpu_block_size: tokens per GPU block (the engine's page).
        page_bytes: bytes of one GPU block over every layer, K and V.
        fingerprint: the model's identity (its ``block_size`` is the GPU block size).
    """

    gpu_block_size: int
    page_bytes: int
    fingerprint: ModelFingerprint


class OffloadingSpec:
    """Sizes, the manager and the worker for one configuration and one KV cache.

    Args:
        config: an ``OffloadingConfig`` or the raw mapping to validate.
        geometry: the engine's KV cache geometry.

    Raises:
        ConfigError: a key is invalid for this engine (the message names it).
    """

    def __init__(self, config: OffloadingConfig | Mapping[str, Any], geometry: KVGeometry) -> None:
        self.config = (
            config if isinstance(config, OffloadingConfig) else OffloadingConfig.from_dict(config)
        )
        self.geometry = geometry
        cfg, gpu_bs = self.config, geometry.gpu_block_size
        if cfg.block_size % gpu_bs:
            raise ConfigError(
                "block_size",
                f"{cfg.block_size} is not a multiple of the engine's block size {gpu_bs}",
            )
        self.block_size_factor = cfg.block_size // gpu_bs
        if cfg.store_policy == "on_evict" and self.block_size_factor != 1:
            raise ConfigError(
                "store_policy",
                "'on_evict' stores single GPU blocks as they are evicted, so block_size "
                f"must equal the engine's block size {gpu_bs} (got {cfg.block_size})",
            )
        self.bytes_per_block = geometry.page_bytes * self.block_size_factor
        # Before anything is allocated or imported: sizes this machine cannot give end
        # here.
        self.num_cpu_blocks = tiers.cpu_blocks(cfg, self.bytes_per_block)
        self.host_bytes = self.num_cpu_blocks * self.bytes_per_block
        stored_fp = dataclasses.replace(geometry.fingerprint, block_size=cfg.block_size)
        self.storage_fingerprint = bytes(root_key(stored_fp, cfg.hash_algorithm))
        self.num_disk_blocks = 0
        if cfg.disk_path is not None:
            self.num_disk_blocks = tiers.disk_blocks(cfg, self.bytes_per_block)
        self._disk: DiskStore | None = None
        self._disk_index: tuple[BlockHash, ...] | None = None
        self._remote: RemoteStore | None = None
        self._groups: list[Any] = []  # handler groups: each shuts its handlers down

    @property
    def has_disk(self) -> bool:
        return self.num_disk_blocks > 0

    @property
    def has_remote(self) -> bool:
        return self.config.remote_url is not None

    def get_manager(self) -> TieredManager:
        """The scheduler side: the CPU tier, with the disk and remote tiers behind it
        if configured (none behind it is a tiering too)."""
        cfg, events = self.config, self.config.enable_events
        cpu = tiers.cpu_tier(
            cfg, self.num_cpu_blocks, block_size=cfg.block_size, enable_events=events
        )
        secondaries = []
        if self.has_disk:
            secondaries.append(
                tiers.disk_tier(
                    cfg,
                    self.num_disk_blocks,
                    self.disk_index(),
                    block_size=cfg.block_size,
                    enable_events=events,
                )
            )
        shared: dict[Medium, SharedStore] = {}
        if self.has_remote:
            secondaries.append(
                tiers.remote_tier(cfg, block_size=cfg.block_size, enable_events=events)
            )
            shared[Medium.REMOTE] = self.remote_store()
        return tiers.tiering(cfg, cpu, secondaries, shared)

    def disk_index(self) -> tuple[BlockHash, ...]:
        """The keys the disk directory held at open, coldest first (read once)."""
        if self._disk_index is None:
            keys = tiers.recovered_keys([self.disk_store()], self.num_disk_blocks)
            self._disk_index = tuple(keys)
        return self._disk_index

    def release_disk_store(self) -> None:
        """Close this process's disk store, so that a worker process can open it."""
        if self._disk is not None:
            self._disk.close()
            self._disk = None

    def remote_store(self) -> RemoteStore:
        """The remote tier's client, opened once (it contacts nothing until used)."""
        if self._remote is None:
            self._remote = tiers.open_remote(self.config, self.storage_fingerprint)
        return self._remote

    def disk_store(self) -> DiskStore:
        """The disk tier's store, opened once (it locks its directory)."""
        if self._disk is None:
            self._disk = tiers.open_disk(self.config, self.storage_fingerprint)
        return self._disk

    def get_worker(self, kv_caches: Sequence[torch.Tensor]) -> OffloadingWorker:
        """The worker side: GPU<->CPU handlers over a host slab, CPU<->disk and
        CPU<->remote if configured."""
        from kvtier.worker import CpuGpuOffloadingHandlers, OffloadingWorker

        gpu = CpuGpuOffloadingHandlers(
            kv_caches, self.geometry.gpu_block_size, self.config.block_size, self.num_cpu_blocks
        )
        worker = OffloadingWorker()
        worker.register_handler(Medium.GPU, Medium.CPU, gpu.gpu_to_cpu_handler)
        worker.register_handler(Medium.CPU, Medium.GPU, gpu.cpu_to_gpu_handler)
        self._groups.append(gpu)
        if self.has_disk:
            from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

            disk = CpuDiskOffloadingHandlers(
                gpu.host_slab.tensor,
                self.disk_store(),
                io_threads=self.config.disk_io_threads,
            )
            worker.register_handler(Medium.CPU, Medium.DISK, disk.cpu_to_disk_handler)
            worker.register_handler(Medium.DISK, Medium.CPU, disk.disk_to_cpu_handler)
            self._groups.append(disk)
        if self.has_remote:
            from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers

            remote = CpuRemoteOffloadingHandlers(
                gpu.host_slab.tensor, self.remote_store(), io_threads=self.config.remote_io_threads
            )
            worker.register_handler(Medium.CPU, Medium.REMOTE, remote.cpu_to_remote_handler)
            worker.register_handler(Medium.REMOTE, Medium.CPU, remote.remote_to_cpu_handler)
            self._groups.append(remote)
        return worker

    def shutdown(self) -> None:
        """Finish queued jobs, stop the handlers, release the slab, close the stores."""
        for group in self._groups:
            group.shutdown()
        self._groups.clear()
        if self._disk is not None:
            self._disk.close()
            self._disk = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None
