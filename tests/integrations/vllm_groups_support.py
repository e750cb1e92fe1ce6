"""vLLM's offload keys, request contexts and offloading config as kvtier reads them,
for the KV cache group tests (``test_vllm_groups``, ``test_vllm_group_jobs``); no vLLM
import."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def key(i: int, group: int) -> bytes:
    """A vLLM offload key: a block hash (here 8 bytes) and the group index."""
    return bytes([i]) * 8 + group.to_bytes(4, "big")


class Context(SimpleNamespace):
    """The two fields of vLLM's ``ReqContext`` kvtier reads."""

    def __init__(self, req_id: str, positions: dict[bytes, int]) -> None:
        super().__init__(req_id=req_id, _offload_key_positions=positions)


def recorded(chunks: int, groups: int, tokens: int = 32) -> dict[bytes, int]:
    """What vLLM records for a request: each group's keys in position order, the
    groups one after another (its ``update_offload_keys``)."""
    return {key(i, g): (i + 1) * tokens for g in range(groups) for i in range(chunks)}


def offloading_config(groups: list[tuple[int, int, list[str]]]) -> Any:
    """The fields of vLLM's ``OffloadingConfig`` the fingerprint reads."""
    return SimpleNamespace(
        model=SimpleNamespace(name="m", dtype="float32"),
        parallel=SimpleNamespace(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, world_size=1),
        cache=SimpleNamespace(tokens_per_hash=32),
        groups=tuple(
            SimpleNamespace(group_id=g, tokens_per_block=t, layer_names=tuple(layers))
            for g, t, layers in groups
        ),
    )
