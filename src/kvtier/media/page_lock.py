"""``PageLock``: host memory page-locked for the GPU while a worker uses it.

Runs in a worker process. Copies between a GPU and page-locked host memory run as
DMA at the link's speed and can overlap compute on a stream of their own; from
pageable memory the driver stages them through a bounce buffer and the copy blocks.
Memory kvtier already has (a mapping of the shared region, an aligned allocation) is
locked in place with ``cudaHostRegister`` -- exactly its size, where torch's pinned
allocator would round each allocation up to a power of two -- and unlocked with
``cudaHostUnregister`` when the worker closes. Without CUDA nothing is locked: the
copies are host copies and gain nothing from it.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class PageLock:
    """``tensor``'s memory page-locked (``cudaHostRegister``) until ``release``.

    Args:
        tensor: a contiguous CPU tensor (its bytes are locked in place).
        required: raise when the driver refuses (default: warn and stay pageable --
            slower copies, the same bytes).

    Attributes:
        locked: whether the memory is page-locked now.
    """

    def __init__(self, tensor: torch.Tensor, *, required: bool = False) -> None:
        self._ptr = tensor.data_ptr()
        self._bytes = tensor.numel() * tensor.element_size()
        self.locked = False
        if not torch.cuda.is_available() or self._bytes == 0:
            return
        err = torch.cuda.cudart().cudaHostRegister(self._ptr, self._bytes, 0)  # type: ignore[no-untyped-call]
        if int(err) != 0:
            message = (
                f"cudaHostRegister of {self._bytes} bytes failed ({err}); copies of the CPU "
                "tier run from pageable memory (slower; raise the memlock limit)"
            )
            if required:
                from kvtier.errors import TransferError

                raise TransferError(message)
            logger.warning("kvtier: %s", message)
            return
        self.locked = True

    def release(self) -> None:
        """Unlock the memory (idempotent); no copy may be in flight."""
        if self.locked:
            self.locked = False
            torch.cuda.cudart().cudaHostUnregister(self._ptr)  # type: ignore[no-untyped-call]
