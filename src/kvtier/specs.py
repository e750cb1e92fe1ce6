"""Load/store specs: small frozen values that tell a worker where blocks are.

Specs are the only currency between the scheduler side (which chooses slots) and
the worker side (which moves bytes). They are plain Python and import no torch.
A transfer is ``(src_spec, dst_spec)``; the worker routes it by the pair of media.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvtier.blocks import BlockId, Medium


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
            raise ValueError(f"skip_count must be >= 0, got {self.skip_count}")


@dataclass(frozen=True, slots=True)
class DiskLoadStoreSpec(BlockIdsSpec):
    """Blocks of a disk tier, by slot id of that tier's index."""

    medium: ClassVar[Medium] = Medium.DISK


@dataclass(frozen=True, slots=True)
class RemoteLoadStoreSpec(BlockIdsSpec):
    """Blocks of a remote tier, by slot id of that tier's index."""

    medium: ClassVar[Medium] = Medium.REMOTE


SPEC_BY_MEDIUM: dict[Medium, type[BlockIdsSpec]] = {
    Medium.CPU: CPULoadStoreSpec,
    Medium.GPU: GPULoadStoreSpec,
    Medium.DISK: DiskLoadStoreSpec,
    Medium.REMOTE: RemoteLoadStoreSpec,
}
