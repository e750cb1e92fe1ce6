"""The storage fingerprint of an engine's blocks under vLLM: what disk and Redis name.

Runs in vLLM's processes; pure Python (it reads vLLM's config object, imports no vLLM).
Blocks stored under vLLM are named by vLLM's own keys inside a directory (disk) or a
key prefix (Redis) derived from this fingerprint, so a block is only ever read by an
engine of the same model -- name, KV dtype, a digest of its checkpoint's files
(``checkpoint``) and the user's optional ``model_identity`` -- the same bytes per
block, the same block size, the same KV cache groups (``group_layout``: which layers
each group holds and its tokens per block, so a model whose layers are grouped
otherwise -- another window pattern, another number of layers per group -- never reads
a group's blocks) and the same parallel layout. Two routes store different
things and never share blocks: kvtier's spec stores each rank's own pages (the rank is
part of its fingerprint), a secondary tier under vLLM's tiering stores whole chunk
rows holding every rank's bytes.
"""

from __future__ import annotations

from typing import Any

from kvtier.keys import ModelFingerprint, root_key


def group_layout(config: Any) -> str:
    """vLLM's KV cache groups as one string: for each group, its index, its tokens per
    GPU block and its layers (``"0:32:model.layers.0.attn,model.layers.2.attn|1:..."``).
    A group's kind (full, sliding window, chunked local, Mamba) follows from the model,
    which the fingerprint names already."""
    return "|".join(
        f"{g.group_id}:{g.tokens_per_block}:{','.join(g.layer_names)}" for g in config.groups
    )


def storage_fingerprint(
    config: Any,
    *,
    layout: str,
    ranks: str,
    block_size: int,
    weights: str,
    identity: str,
    engine: str,
) -> bytes:
    """The digest naming this engine's blocks in disk and Redis.

    Args:
        config: vLLM's offloading config (``model``, ``parallel``, ``cache``,
            ``groups``).
        layout: what one stored value holds, with its size (``"vllm-pages/4096B"``).
        ranks: which ranks' bytes a value holds (``"rank0"``, ``"all-ranks"``).
        block_size: tokens per offloaded block.
        weights: the checkpoint's digest (``checkpoint.checkpoint_digest``).
        identity: the user's ``model_identity`` key (``""`` when not given).
        engine: which route stores them (``"vllm"``, ``"vllm-tiering"``).
    """
    par = config.parallel
    fp = ModelFingerprint(
        model_id=str(config.model.name),
        dtype=str(config.model.dtype),
        kv_layout=layout,
        block_size=block_size,
        parallel=(
            f"tp{par.tp_size}/pp{par.pp_size}/pcp{par.pcp_size}/dcp{par.dcp_size}"
            f"/world{par.world_size}/{ranks}"
        ),
        weights=weights,
        extra=(
            ("engine", engine),
            ("tokens_per_hash", str(config.cache.tokens_per_hash)),
            ("kv_groups", group_layout(config)),
            ("model_identity", identity),
        ),
    )
    return bytes(root_key(fp))
