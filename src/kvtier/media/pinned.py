"""Host memory for the CPU tier: one exactly-sized slab per KV tensor group.

Runs in the worker process. A slab is ``num_blocks x page_bytes`` bytes of host
memory, carved into offloaded blocks (row ``c`` is offloaded block ``c``). It is
pinned (page-locked) when CUDA is available, so that copies to and from the GPU run
as DMA without a bounce buffer, and plain memory otherwise.

Pinning registers an ordinary allocation with ``cudaHostRegister`` rather than
asking torch for ``pin_memory=True``: torch's pinned allocator rounds each request up
to a power of two, so 40 GiB of blocks would take 64 GiB of locked memory. With
registration the slab takes exactly what ``host_sizing`` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvtier.errors import CapacityError, ConfigError, TransferError
from kvtier.media.direct_io import aligned_empty


@dataclass(frozen=True, slots=True)
class HostSizing:
    """What a ``cpu_bytes_to_use`` budget buys.

    Attributes:
        bytes_per_block: host bytes of one offloaded block (every tensor of the group).
        num_blocks: offloaded blocks that fit: ``cpu_bytes_to_use // bytes_per_block``.
        host_bytes: host memory the slab really takes: ``num_blocks * bytes_per_block``
            (never more than ``cpu_bytes_to_use``; the remainder is not allocated).
    """

    bytes_per_block: int
    num_blocks: int
    host_bytes: int


def host_sizing(
    cpu_bytes_to_use: int, page_bytes: int | Sequence[int], block_size_factor: int = 1
) -> HostSizing:
    """How many offloaded blocks ``cpu_bytes_to_use`` holds, and the bytes it really takes.

    Args:
        cpu_bytes_to_use: the host memory budget of the CPU tier, in bytes.
        page_bytes: bytes of one GPU block, or per-tensor page sizes to add up
            (e.g. ``KVCacheView.frag_bytes``).
        block_size_factor: GPU blocks per offloaded block.

    Raises:
        ConfigError: on a non-positive budget, page size or factor.
        CapacityError: when the budget does not hold a single offloaded block.
    """
    pages = [page_bytes] if isinstance(page_bytes, int) else list(page_bytes)
    if cpu_bytes_to_use <= 0:
        raise ConfigError("cpu_bytes_to_use", f"must be > 0, got {cpu_bytes_to_use}")
    if block_size_factor < 1:
        raise ConfigError("block_size", f"block_size_factor must be >= 1, got {block_size_factor}")
    if not pages or any(p <= 0 for p in pages):
        raise ConfigError("gpu_kv_caches", f"page sizes must be positive, got {pages}")
    per_block = sum(pages) * block_size_factor
    num_blocks = cpu_bytes_to_use // per_block
    if num_blocks == 0:
        raise CapacityError(
            f"cpu_bytes_to_use={cpu_bytes_to_use} holds no offloaded block of {per_block} "
            f"bytes; raise it to at least {per_block}"
        )
    return HostSizing(per_block, num_blocks, num_blocks * per_block)


def pinning_available() -> bool:
    """Whether host memory can be page-locked here (a CUDA device is present)."""
    return torch.cuda.is_available()


class HostSlab:
    """``num_blocks`` offloaded blocks of ``page_bytes`` each, in one host allocation.

    Attributes:
        tensor: ``(num_blocks, page_bytes)`` uint8; row ``c`` is offloaded block ``c``.
        pinned: whether the memory is page-locked.

    Contents start zeroed; a block is only read after a store has written it. The slab
    starts on a page boundary (rows are page-aligned when ``page_bytes`` is a multiple
    of 4 KiB), which the disk tier's direct I/O needs.
    Call ``close()`` (or use ``with``) to unpin; the memory goes with the last reference.
    """

    __slots__ = ("pinned", "tensor")

    def __init__(self, num_blocks: int, page_bytes: int, pin: bool | None = None) -> None:
        """Allocate the slab.

        Args:
            num_blocks: offloaded blocks (rows).
            page_bytes: bytes per offloaded block.
            pin: page-lock it; default: when CUDA is available.

        Raises:
            ConfigError: on a non-positive size, or ``pin=True`` without CUDA.
            TransferError: when the driver refuses to pin the memory.
        """
        if num_blocks <= 0 or page_bytes <= 0:
            raise ConfigError(
                "num_cpu_blocks", f"slab needs positive sizes, got {num_blocks} x {page_bytes}"
            )
        pin = pinning_available() if pin is None else pin
        if pin and not pinning_available():
            raise ConfigError("pin", "cannot pin host memory without CUDA")
        # One page-aligned anonymous mapping: rows of whole pages can then go to and
        # from disk with O_DIRECT, and the kernel hands out zeroed pages on first touch.
        self.tensor = torch.from_numpy(aligned_empty(num_blocks * page_bytes)).view(
            num_blocks, page_bytes
        )
        self.pinned = False
        if pin:
            err = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.nbytes, 0)  # type: ignore[no-untyped-call]
            if int(err) != 0:
                raise TransferError(f"cudaHostRegister of {self.nbytes} bytes failed: {err}")
            self.pinned = True

    @property
    def num_blocks(self) -> int:
        """Offloaded blocks in the slab."""
        return int(self.tensor.shape[0])

    @property
    def page_bytes(self) -> int:
        """Bytes per offloaded block."""
        return int(self.tensor.shape[1])

    @property
    def nbytes(self) -> int:
        """Host bytes the slab takes: exactly ``num_blocks * page_bytes``."""
        return self.num_blocks * self.page_bytes

    def block(self, block_id: int) -> torch.Tensor:
        """The bytes of one offloaded block (a view)."""
        return self.tensor[block_id]

    def close(self) -> None:
        """Unpin the memory (idempotent). Copies must have finished."""
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())  # type: ignore[no-untyped-call]
            self.pinned = False

    def __enter__(self) -> HostSlab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
