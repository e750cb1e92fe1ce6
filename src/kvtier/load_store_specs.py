"""Load/store specs: small frozen values that tell a worker where blocks are.

Specs are the only currency between the scheduler side (which chooses slots) and
the worker side (which moves bytes). They are plain Python and import no torch.
A transfer is ``(src_spec, dst_spec)``; the worker routes it by the pair of media.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.errors import TransferSpecError


@dataclass(frozen=True, slots=True)
class LoadStoreSpec:
    """Base of every spec. Subclasses set ``medium``."""

    medium: ClassVar[Medium]


@dataclass(frozen=True, slots=True)
class BlockIdsSpec(LoadStoreSpec):
    """Blocks named by their slot ids in one medium, in the order of the keys."""

    block_ids: tuple[BlockId, ...]

    def __len__(self) -> int:
        return len(self.block_ids)

    @classmethod
    def for_blocks(
        cls, block_hashes: Sequence[BlockHash], block_ids: Sequence[BlockId]
    ) -> BlockIdsSpec:
        """The spec a manager hands out for these keys in these slots."""
        return cls(tuple(block_ids))


@dataclass(frozen=True, slots=True)
class CPULoadStoreSpec(BlockIdsSpec):
    """Offloaded blocks (``block_size`` tokens each) in the host-memory slab."""

    medium: ClassVar[Medium] = Medium.CPU


@dataclass(frozen=True, slots=True)
class GPULoadStoreSpec(BlockIdsSpec):
    """GPU blocks (``gpu_block_size`` tokens each) in the engine's KV cache.

    Attributes:
        block_ids: GPU block ids, in token order.
        skip_count: how many GPU blocks of the *first offloaded block* are not part
            of this transfer (a load or store that starts in the middle of an
            offloaded block). ``0`` for aligned transfers. See
            ``kvtier.worker.blockmap.expand_block_ids``.
    """

    medium: ClassVar[Medium] = Medium.GPU
    skip_count: int = 0

    def __post_init__(self) -> None:
        if self.skip_count < 0:
            raise TransferSpecError(f"skip_count must be >= 0, got {self.skip_count}")


@dataclass(frozen=True, slots=True)
class KeyedBlocksSpec(BlockIdsSpec):
    """Blocks of a persistent tier, named by their keys (and slots of its index).

    A persistent store names what it holds by block key, so that another process, or
    the same one after a restart, finds it again; the slot ids only account capacity.

    Attributes:
        block_ids: slots of the scheduler's index of the tier, one per key.
        block_hashes: the keys, in transfer order.
        evicted_hashes: keys the tier's index dropped (evicted to make room for this
            store, or unreadable): a store job's worker removes them from the medium
            before writing (the disk reuses one of the same size as the new block's
            file, ``DiskStore.write``), so the medium follows the index with no index of
            its own.
    """

    block_hashes: tuple[BlockHash, ...] = ()
    evicted_hashes: tuple[BlockHash, ...] = ()

    @classmethod
    def for_blocks(
        cls, block_hashes: Sequence[BlockHash], block_ids: Sequence[BlockId]
    ) -> BlockIdsSpec:
        return cls(tuple(block_ids), tuple(block_hashes))


@dataclass(frozen=True, slots=True)
class DiskLoadStoreSpec(KeyedBlocksSpec):
    """Blocks of a disk tier: one file per block key."""

    medium: ClassVar[Medium] = Medium.DISK


@dataclass(frozen=True, slots=True)
class RemoteLoadStoreSpec(KeyedBlocksSpec):
    """Blocks of a remote tier: one value per block key."""

    medium: ClassVar[Medium] = Medium.REMOTE


SPEC_BY_MEDIUM: dict[Medium, type[BlockIdsSpec]] = {
    Medium.CPU: CPULoadStoreSpec,
    Medium.GPU: GPULoadStoreSpec,
    Medium.DISK: DiskLoadStoreSpec,
    Medium.REMOTE: RemoteLoadStoreSpec,
}
