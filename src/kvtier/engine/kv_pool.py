"""The paged KV pool: every layer's K and V, in fixed-size pages on the model's device.

Runs in the engine process; the tensors live on the model's device (the "GPU" of the
design, the CPU when there is none). One tensor per layer::

    kv_caches[layer]: (2, num_blocks, block_size, num_kv_heads, head_dim)
                       K/V  page       token in page

This exact layout is what kvtier's worker side accepts (it views each tensor as
``(num_blocks, page_bytes)`` per K/V half). Token ``t`` of a request whose block table
is ``table`` lives in page ``table[t // block_size]`` at row ``t % block_size``; its
*slot* is ``table[t // block_size] * block_size + t % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from kvtier.blocks import BlockId
from kvtier.errors import ConfigError


@dataclass(frozen=True, slots=True)
class KVShape:
    """The shape of one token's KV across the model.

    Attributes:
        num_layers: decoder layers, each with its own K and V.
        num_kv_heads: key/value heads per layer (fewer than query heads under GQA).
        head_dim: elements per head.
        dtype: element type of the pool (the model's dtype).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of_model(cls, model: PreTrainedModel) -> KVShape:
        """Read the layout from a Hugging Face decoder's config."""
        config = model.config
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        heads = getattr(config, "num_attention_heads", None)
        layers = getattr(config, "num_hidden_layers", None)
        hidden = getattr(config, "hidden_size", None)
        if not heads or not layers or not hidden:
            raise ConfigError(
                "model", f"{type(model).__name__} does not look like a decoder-only transformer"
            )
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return cls(int(layers), int(kv_heads), int(head_dim), model.dtype)


class KVPool:
    """Every layer's KV pages, allocated once.

    Attributes:
        kv_caches: per layer, ``(2, num_blocks, block_size, num_kv_heads, head_dim)``.
        layout: the per-token shape.
        num_blocks: pages per layer.
        block_size: tokens per page.
    """

    def __init__(
        self, layout: KVShape, num_blocks: int, block_size: int, device: torch.device
    ) -> None:
        if num_blocks < 1:
            raise ConfigError("num_gpu_blocks", f"must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ConfigError("block_size", f"must be >= 1, got {block_size}")
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (2, num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
        self.kv_caches: list[torch.Tensor] = [
            torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)
        ]

    @property
    def device(self) -> torch.device:
        return self.kv_caches[0].device

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers, K and V."""
        lay = self.layout
        elem = torch.empty((), dtype=lay.dtype).element_size()
        return 2 * lay.num_layers * self.block_size * lay.num_kv_heads * lay.head_dim * elem

    def slots(self, block_table: Sequence[BlockId], start: int, end: int) -> torch.Tensor:
        """Slot indices of tokens ``start .. end - 1`` of a request, on the pool's device."""
        positions = torch.arange(start, end)
        table = torch.tensor(list(block_table), dtype=torch.long)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        return slots.to(self.device)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given slots, each ``(num_kv_heads, len(slots), head_dim)``."""
        flat = self._flat(layer)
        kv = flat.index_select(1, slots)  # (2, n, heads, dim)
        kv = kv.permute(0, 2, 1, 3)
        return kv[0], kv[1]

    def scatter(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K and V, each ``(num_kv_heads, len(slots), head_dim)``, into the slots."""
        kv = torch.stack((k, v)).permute(0, 2, 1, 3).to(self.layout.dtype)
        self._flat(layer).index_copy_(1, slots, kv)

    def _flat(self, layer: int) -> torch.Tensor:
        lay = self.layout
        # A view: the pages are contiguous, so the flat slot axis shares their storage.
        return self.kv_caches[layer].view(
            2, self.num_blocks * self.block_size, lay.num_kv_heads, lay.head_dim
        )
