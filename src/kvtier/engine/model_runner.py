"""The model runner: one forward pass over paged KV, greedy next tokens out.

Runs in the engine process, on the model's device. For each forward it

1. gathers every sequence's past KV from its pages into a transformers
   ``DynamicCache`` (``(batch, kv_heads, past, head_dim)`` per layer);
2. runs the model on the new tokens only, with explicit ``position_ids``;
3. scatters the new tokens' K and V, which the model appended to the cache, back into
   the sequences' pages; and returns the greedy next token of each sequence.

Several sequences go in one batch when they all feed the same number of new tokens
(decode: one each). Shorter pasts are left-padded and masked::

    seq 0:  [pad pad  p0  p1  p2 | new]      attention_mask 0 0 1 1 1 1
    seq 1:  [ p0  p1  p2  p3  p4 | new]      attention_mask 1 1 1 1 1 1
             <------ max_past ---->

Padded keys get exactly zero attention weight, and positions come from
``position_ids``, so each sequence computes what it would alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from kvtier.blocks import BlockId
from kvtier.engine.hf_compat import cache_from_past, cache_keyword, last_logits_kwargs, layer_kv
from kvtier.engine.kv_pool import KVPool
from kvtier.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class SeqInput:
    """One sequence's share of a forward pass.

    Attributes:
        block_table: the sequence's pages, covering at least ``num_past + len(token_ids)``
            tokens.
        num_past: tokens whose KV is already in the pages (positions ``0 .. num_past-1``).
        token_ids: the tokens to run, at positions ``num_past ..``.
    """

    block_table: tuple[BlockId, ...]
    num_past: int
    token_ids: tuple[int, ...]


class ModelRunner:
    """Runs a Hugging Face causal LM over a ``KVPool``.

    Args:
        model: a decoder-only model in eval mode, on the pool's device.
        pool: the pages; its layout must match the model's.
    """

    def __init__(self, model: PreTrainedModel, pool: KVPool) -> None:
        self.model = model
        self.pool = pool
        self._logits_kwargs = last_logits_kwargs(model)
        self._cache_keyword = cache_keyword(model)

    @torch.inference_mode()
    def run(self, seqs: Sequence[SeqInput]) -> list[int]:
        """One forward pass; writes the new KV into the pages; greedy next token per seq.

        Raises:
            ProtocolError: the batch is empty, ragged (different numbers of new tokens),
                or a block table is too short.
        """
        if not seqs:
            raise ProtocolError("run: empty batch")
        n = len(seqs[0].token_ids)
        bs = self.pool.block_size
        for s in seqs:
            if len(s.token_ids) != n or n == 0:
                raise ProtocolError("run: every sequence must feed the same, non-zero count")
            if len(s.block_table) * bs < s.num_past + n:
                raise ProtocolError(
                    f"run: {len(s.block_table)} blocks cannot hold {s.num_past + n} tokens"
                )
        device = self.pool.device
        max_past = max(s.num_past for s in seqs)
        past_slots = [self.pool.slots(s.block_table, 0, s.num_past) for s in seqs]
        cache = cache_from_past(
            [self._gather_layer(layer, seqs, past_slots, max_past) for layer in self._layers()]
            if max_past > 0
            else []
        )
        mask = torch.zeros(len(seqs), max_past + n, dtype=torch.long)
        for i, s in enumerate(seqs):
            mask[i, max_past - s.num_past :] = 1
        positions = torch.stack([torch.arange(s.num_past, s.num_past + n) for s in seqs])
        out = self.model(
            input_ids=torch.tensor([list(s.token_ids) for s in seqs], device=device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            **{self._cache_keyword: cache},
            **self._logits_kwargs,
        )
        new_slots = torch.cat(
            [self.pool.slots(s.block_table, s.num_past, s.num_past + n) for s in seqs]
        )
        for layer in self._layers():
            k, v = layer_kv(cache, layer)
            self.pool.scatter(layer, new_slots, _new_rows(k, max_past), _new_rows(v, max_past))
        return [int(t) for t in out.logits[:, -1, :].argmax(dim=-1).tolist()]

    def _layers(self) -> range:
        return range(self.pool.layout.num_layers)

    def _gather_layer(
        self,
        layer: int,
        seqs: Sequence[SeqInput],
        past_slots: Sequence[torch.Tensor],
        max_past: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(seqs) == 1:
            k, v = self.pool.gather(layer, past_slots[0])
            return k.unsqueeze(0), v.unsqueeze(0)
        lay = self.pool.layout
        shape = (len(seqs), lay.num_kv_heads, max_past, lay.head_dim)
        k_all = torch.zeros(shape, dtype=lay.dtype, device=self.pool.device)
        v_all = torch.zeros_like(k_all)
        for i, (s, slots) in enumerate(zip(seqs, past_slots, strict=True)):
            if s.num_past:
                k, v = self.pool.gather(layer, slots)
                k_all[i, :, max_past - s.num_past :] = k
                v_all[i, :, max_past - s.num_past :] = v
        return k_all, v_all


def _new_rows(x: torch.Tensor, max_past: int) -> torch.Tensor:
    """``(batch, heads, max_past + n, dim)`` -> the new rows as ``(heads, batch * n, dim)``."""
    new = x[:, :, max_past:]
    return new.permute(1, 0, 2, 3).reshape(new.shape[1], -1, new.shape[3])
