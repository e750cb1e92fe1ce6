"""Tiers from one validated configuration: the one place kvtier's tiers are assembled.

Runs in the scheduler process (the reference engine's, or vLLM's EngineCore); the
scheduler-side pieces are pure Python and the media are imported only when a tier is
configured. Every engine builds its tiers here -- ``OffloadingSpec`` (the reference
engine), ``KvtierOffloadingSpec`` (vLLM) and the secondary tiers under vLLM's own
tiering -- so a tier is sized, opened, indexed and connected the same way everywhere:

* ``disk_blocks`` sizes the disk tier (block files of a given payload in a byte budget);
  ``open_disk`` checks the file system and opens the store (mode 0700, locked);
  ``recovered_keys`` reads what one store -- or every rank's store of one engine --
  already holds, coldest first; ``disk_tier`` is the index over it.
* ``open_remote`` connects the Redis tier (``RemoteOptions.from_config``: the
  ``remote_*`` keys, 2n + 2 connections); ``remote_tier`` is the
  index of what this engine knows the shared store holds (the server's own maxmemory
  policy owns the real capacity, so the index is LRU over ``remote_index_blocks``).
* ``cpu_tier`` is the primary tier; ``tiering`` composes it with the secondaries.
* ``encryption_keys`` reads ``encryption_key_file``: with it, ``open_disk`` and
  ``open_remote`` open stores that seal every block (``kvtier.media.sealing``).

Checks that depend on the engine (a size against this machine's memory, a budget that
holds no block of this model) raise ``ConfigError`` naming the key; the keys
themselves are validated once, in ``kvtier.config``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvtier.blocks import BlockHash, Medium
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.key_file import EncryptionKey, read_key_file
from kvtier.machine import check_disk, check_memory
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.tiering import SharedStore, TieredManager
from kvtier.sizes import format_bytes

if TYPE_CHECKING:
    from kvtier.media.disk import DiskStore
    from kvtier.media.remote import RemoteStore


def cpu_blocks(config: OffloadingConfig, bytes_per_block: int, *, check: bool = True) -> int:
    """How many offloaded blocks of ``bytes_per_block`` the CPU tier holds.

    Args:
        config: the validated configuration (``cpu_bytes_to_use``).
        bytes_per_block: one block's bytes in host memory (every rank's share of it).
        check: refuse a budget larger than the memory this machine has now.

    Raises:
        ConfigError: ``cpu_bytes_to_use`` holds no block, or exceeds free memory.
    """
    n = config.num_cpu_blocks(bytes_per_block)
    if check:
        check_memory("cpu_bytes_to_use", n * bytes_per_block)
    return n


def cpu_tier(
    config: OffloadingConfig, num_blocks: int, *, block_size: int, enable_events: bool
) -> CPUOffloadingManager:
    """The primary tier: ``eviction_policy`` over ``num_blocks`` slots of host memory.

    ``store_policy: "reuse"`` is reuse-gated admission with a threshold of at least 2.
    """
    threshold = config.store_threshold
    if config.store_policy == "reuse":
        threshold = max(threshold, 2)
    return CPUOffloadingManager(
        num_blocks=num_blocks,
        block_size=block_size,
        eviction_policy=config.eviction_policy,
        enable_events=enable_events,
        store_threshold=threshold,
    )


def disk_blocks(config: OffloadingConfig, payload_bytes: int, *, stores: int = 1) -> int:
    """How many blocks the disk tier holds, each store a block file of ``payload_bytes``.

    Args:
        config: the validated configuration (``disk_path`` set).
        payload_bytes: one block's bytes in one store (a rank's shard under vLLM).
        stores: the stores sharing ``disk_bytes_to_use`` evenly (one per rank).

    Raises:
        ConfigError: a store's share of ``disk_bytes_to_use`` holds no block file, or
            the file system cannot give the budget.
    """
    from kvtier.media.disk_layout import block_file_size

    assert config.disk_path is not None and config.disk_bytes_to_use is not None
    path = Path(config.disk_path)
    # What the directory already holds counts as available (a restart); DiskStore.open
    # then checks exactly, for this model's blocks.
    check_disk("disk_bytes_to_use", path, config.disk_bytes_to_use, tier_dir=path)
    share = config.disk_bytes_to_use // stores
    file_bytes = block_file_size(payload_bytes)
    n = share // file_bytes
    if n < 1:
        per = f" per store ({stores} ranks)" if stores > 1 else ""
        raise ConfigError(
            "disk_bytes_to_use",
            f"{format_bytes(share)}{per} holds no block file of {format_bytes(file_bytes)}; "
            f"give at least {file_bytes * stores} bytes",
        )
    return n


def encryption_keys(config: OffloadingConfig) -> tuple[EncryptionKey, ...]:
    """The keys of ``encryption_key_file`` (read again: a tier opens with the file as it
    is then), or none.

    Raises:
        ConfigError: the file no longer holds valid keys.
    """
    if config.encryption_key_file is None:
        return ()
    return read_key_file(config.encryption_key_file)


def open_disk(config: OffloadingConfig, fingerprint: bytes, *, stores: int = 1) -> DiskStore:
    """Open (and lock) the disk store of ``fingerprint`` with its share of the budget,
    sealing its blocks with ``encryption_key_file``'s keys if it is set."""
    from kvtier.media.disk import DiskStore

    assert config.disk_path is not None and config.disk_bytes_to_use is not None
    keys = encryption_keys(config)
    Path(config.disk_path).mkdir(parents=True, exist_ok=True, mode=0o700)
    return DiskStore.open(
        config.disk_path,
        fingerprint,
        config.disk_bytes_to_use // stores,
        fsync=config.disk_fsync,
        direct_io=config.disk_direct_io,
        keys=keys,
    )


def recovered_keys(stores: Sequence[DiskStore], num_blocks: int) -> list[BlockHash]:
    """The blocks ``stores`` hold at open, coldest first, at most ``num_blocks``.

    With several stores (one per rank of one engine) a block counts only when every
    store holds its shard: a lone shard can never be loaded, so it is deleted here.
    """
    held = [set(store.keys()) for store in stores]
    complete = set.intersection(*held)
    for store, keys in zip(stores, held, strict=True):
        for key in keys - complete:
            store.delete(key)
    recovered = [BlockHash(b.key) for b in stores[0].recovered if b.key in complete]
    return recovered[-num_blocks:] if num_blocks else []


def disk_tier(
    config: OffloadingConfig,
    num_blocks: int,
    recovered: Sequence[BlockHash],
    *,
    block_size: int,
    enable_events: bool,
) -> TierManager:
    """The disk tier's index: ``disk_eviction_policy`` over ``num_blocks``, holding
    ``recovered`` (coldest first) as READY."""
    tier = TierManager(
        medium=Medium.DISK,
        num_blocks=num_blocks,
        block_size=block_size,
        policy=make_policy(config.disk_eviction_policy, num_blocks),
        enable_events=enable_events,
    )
    tier.restore(recovered)
    return tier


def open_remote(config: OffloadingConfig, fingerprint: bytes) -> RemoteStore:
    """The Redis tier's client for blocks of ``fingerprint``, after one contact with the
    server (``RemoteStore.open``), sealing its values with ``encryption_key_file``'s
    keys if it is set."""
    from kvtier.media.remote import RemoteStore
    from kvtier.media.remote_options import RemoteOptions

    keys = encryption_keys(config)
    return RemoteStore.open(fingerprint, RemoteOptions.from_config(config), keys=keys)


def remote_tier(config: OffloadingConfig, *, block_size: int, enable_events: bool) -> TierManager:
    """The index of the blocks this engine knows the shared store holds (LRU)."""
    n = config.remote_index_blocks
    return TierManager(
        medium=Medium.REMOTE,
        num_blocks=n,
        block_size=block_size,
        policy=make_policy("lru", n),
        enable_events=enable_events,
    )


def tiering(
    config: OffloadingConfig,
    cpu: TierManager,
    secondaries: Sequence[TierManager],
    shared: Mapping[Medium, SharedStore] | None = None,
) -> TieredManager:
    """The CPU tier in front of ``secondaries`` (disk, then remote), write-through."""
    return TieredManager(
        cpu, secondaries, max_pending_writes=config.max_pending_writes, shared=shared
    )
