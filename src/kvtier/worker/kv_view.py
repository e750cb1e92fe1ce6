"""Canonical byte views of an engine's KV cache tensors.

Runs wherever the tensors live (GPU, or CPU standing in for it); builds views only,
never copies. Every KV cache tensor becomes one or more *fragments*: 2-D ``uint8``
views of shape ``(num_blocks, frag_bytes)`` in which row ``i`` holds exactly the bytes
of block ``i``. A GPU block's *page* is the concatenation of its rows in every
fragment, in order; ``page_bytes`` is its size.

==============  ======================================  ==========================
layout          tensor shape                            fragments per tensor
==============  ======================================  ==========================
``KV_FIRST``    ``(2, num_blocks, block_size, h, d)``   2: the K page, the V page
``BLOCKS_FIRST`` ``(num_blocks, 2, block_size, h, d)``  1: K and V together
``CROSS_LAYER`` ``(num_blocks, ...)``, every layer      1: all layers together
==============  ======================================  ==========================

In ``KV_FIRST`` a block's K rows and V rows are ``num_blocks * frag_bytes`` apart, so
they are honestly two fragments; nothing pretends they are one page.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvtier.errors import ConfigError


class KVLayout(str, enum.Enum):
    """How a KV cache tensor orders its dimensions (see the module table)."""

    KV_FIRST = "kv_first"
    BLOCKS_FIRST = "blocks_first"
    CROSS_LAYER = "cross_layer"


@dataclass(frozen=True, slots=True)
class KVCacheView:
    """The fragments of a list of KV cache tensors, all with the same ``num_blocks``.

    Attributes:
        fragments: ``(num_blocks, frag_bytes)`` uint8 views, sharing the tensors' memory.
        num_blocks: blocks in every tensor.
        layout: the layout the tensors were read as.
    """

    fragments: tuple[torch.Tensor, ...]
    num_blocks: int
    layout: KVLayout

    @property
    def frag_bytes(self) -> tuple[int, ...]:
        """Bytes of one block in each fragment."""
        return tuple(int(f.shape[1]) for f in self.fragments)

    @property
    def page_bytes(self) -> int:
        """Bytes of one GPU block across every fragment (all layers, K and V)."""
        return sum(self.frag_bytes)


def _byte_view(tensor: torch.Tensor, index: int) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise ConfigError(
            "gpu_kv_caches", f"tensor {index} is not contiguous; pass the cache tensor itself"
        )
    return tensor.reshape(-1).view(torch.uint8)


def kv_cache_view(
    tensors: Sequence[torch.Tensor],
    layout: KVLayout | str = KVLayout.KV_FIRST,
    block_size: int | None = None,
) -> KVCacheView:
    """Read ``tensors`` as fragments of byte pages.

    Args:
        tensors: one tensor per layer (``KV_FIRST`` / ``BLOCKS_FIRST``), or one or more
            cross-layer tensors (``CROSS_LAYER``); any dtype, contiguous.
        layout: how to read them (the reference engine uses ``KV_FIRST``).
        block_size: tokens per block, checked against dimension 2 of per-layer
            tensors when given.

    Raises:
        ConfigError: (key ``gpu_kv_caches``) on an empty list, a shape that does not
            fit the layout, mixed block counts or a non-contiguous tensor.
    """
    layout = KVLayout(layout)
    if not tensors:
        raise ConfigError("gpu_kv_caches", "no KV cache tensors given")
    fragments: list[torch.Tensor] = []
    counts = set()
    for i, t in enumerate(tensors):
        shape = tuple(t.shape)
        if layout is KVLayout.CROSS_LAYER:
            if t.dim() < 2:
                raise ConfigError("gpu_kv_caches", f"tensor {i} has shape {shape}; need >= 2 dims")
            n = shape[0]
            fragments.append(_byte_view(t, i).view(n, -1))
        else:
            kv_dim = 0 if layout is KVLayout.KV_FIRST else 1
            if t.dim() != 5 or shape[kv_dim] != 2:
                want = "(2, num_blocks, ...)" if kv_dim == 0 else "(num_blocks, 2, ...)"
                raise ConfigError(
                    "gpu_kv_caches",
                    f"tensor {i} has shape {shape}; layout {layout.value} needs 5 dims {want}",
                )
            if block_size is not None and shape[2] != block_size:
                raise ConfigError(
                    "gpu_kv_caches",
                    f"tensor {i} has block size {shape[2]} (dim 2), expected {block_size}",
                )
            n = shape[1 - kv_dim]
            raw = _byte_view(t, i)
            if layout is KVLayout.KV_FIRST:
                kv = raw.view(2, n, -1)
                fragments.extend((kv[0], kv[1]))
            else:
                fragments.append(raw.view(n, -1))
        counts.add(n)
    if len(counts) != 1:
        raise ConfigError("gpu_kv_caches", f"tensors disagree on num_blocks: {sorted(counts)}")
    return KVCacheView(fragments=tuple(fragments), num_blocks=counts.pop(), layout=layout)


_WORDS = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16))


def word_dtype(*views: torch.Tensor) -> torch.dtype:
    """The widest dtype that tiles every 2-D uint8 view exactly (offsets, rows, strides).

    Copy kernels cost per element, so a copy of 16-byte words runs several times
    faster than one of bytes (measured on CPU: ``index_copy_`` at ~1 GB/s over uint8,
    ~8 GB/s over int64, ~14 GB/s over complex128). Copies are bitwise either way: the
    kernels load and store, never compute (tests move NaN bit patterns to check).
    """
    for size, dtype in _WORDS:
        if all(
            v.data_ptr() % size == 0 and v.shape[1] % size == 0 and v.stride(0) % size == 0
            for v in views
        ):
            return dtype
    return torch.uint8


def as_words(view: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``view`` (2-D uint8, rows contiguous) re-read as ``dtype`` words; no copy."""
    return view if dtype == torch.uint8 else view.view(dtype)
