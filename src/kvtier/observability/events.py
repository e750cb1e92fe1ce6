"""KV events in vLLM's wire format, and the translation of kvtier's events into them.

Runs in the scheduler process; pure Python (msgspec). A router that subscribes to
vLLM's KV events (``vllm.distributed.kv_events``, vLLM 0.33) decodes these batches with
its own classes, unchanged. The classes below are written for kvtier; their encoding
matches vLLM's field by field:

* ``KVEventBatch`` is a msgpack **array** ``[ts, events, data_parallel_rank]``
  (``array_like``; the publisher stamps the rank, 0 by default).
* Each event is a msgpack **map** tagged ``"type"`` with the class name
  (``"BlockStored"``, ``"BlockRemoved"``, ``"AllBlocksCleared"``); fields whose value
  is their default are left out (``omit_defaults``).
* ``BlockStored``: ``block_hashes``, ``parent_block_hash``, ``token_ids``,
  ``block_size``, ``lora_id``, ``medium``, ``lora_name``, then optional
  ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``,
  ``kv_cache_spec_sliding_window``, ``locality``, ``ownership``, ``session_id``,
  ``lookahead_token_ids``. ``BlockRemoved``: ``block_hashes``, ``medium``, then
  optional ``group_idx``, ``locality``, ``ownership``.

kvtier's side of the mapping (see ``docs/observability.md``): one ``OffloadingEvent``
becomes one event; ``block_hashes`` are kvtier's block keys -- the raw digest bytes
(as vLLM sends its own SHA-256 block hashes), or with ``int_hashes`` their low 64 bits
as an unsigned big-endian integer (as vLLM does under
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); ``medium`` is the tier (``"CPU"``,
``"DISK"``, ``"REMOTE"``); ``block_size`` is the tokens of one offloaded block; a
block's tokens and parent are not known where the event is made, so ``token_ids`` is
empty and ``parent_block_hash`` is ``None`` (vLLM's own offloading events do the same);
``locality`` is ``"REMOTE"`` for a tier shared with other engines, else ``"LOCAL"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from kvtier.blocks import Medium
from kvtier.scheduler.protocol import OffloadingEvent

ExternalBlockHash = bytes | int
"""What an event names a block by: digest bytes, or a 64-bit integer."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch of events: ``[ts, events, data_parallel_rank]`` on the wire."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the events: a map tagged ``type`` with the class name."""


class BlockStored(KVCacheEvent):
    """Blocks that became loadable in ``medium``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks that left ``medium``."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Everything the publisher held is gone (kvtier sends it when an engine closes)."""


class KVEventBatch(EventBatch):
    """The batch type subscribers decode: its events are the three kinds above."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_SHARED = frozenset({Medium.REMOTE})


def external_hash(key: bytes, int_hashes: bool = False) -> ExternalBlockHash:
    """The hash an event carries for kvtier block ``key`` (see the module docstring)."""
    if int_hashes:
        return int.from_bytes(key, "big") & ((1 << 64) - 1)
    return bytes(key)


def to_kv_events(
    events: Iterable[OffloadingEvent], int_hashes: bool = False
) -> list[BlockStored | BlockRemoved]:
    """One vLLM event per kvtier ``OffloadingEvent``, in order."""
    out: list[BlockStored | BlockRemoved] = []
    for event in events:
        hashes = [external_hash(k, int_hashes) for k in event.block_hashes]
        medium = str(event.medium)
        locality = "REMOTE" if event.medium in _SHARED else "LOCAL"
        if event.removed:
            out.append(BlockRemoved(block_hashes=hashes, medium=medium, locality=locality))
        else:
            out.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=event.block_size,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                    locality=locality,
                )
            )
    return out
