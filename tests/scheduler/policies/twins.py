"""A real policy and its model, each behind its own TierManager, served the same requests.

Shared by the leader tests: every step asserts that the two managers answer alike
(lookup hits, the store's plan) before the caller compares the policies' state.
"""

from __future__ import annotations

from kvtier.blocks import BlockHash, Medium
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.serve import serve_request


def block_key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def manager_for(policy: object, capacity: int) -> TierManager:
    return TierManager(medium=Medium.CPU, num_blocks=capacity, block_size=16, policy=policy)  # type: ignore[arg-type]


def serve(
    real: TierManager, twin: TierManager, ids: list[int], load: bool, ok: bool
) -> tuple[list[BlockHash], int]:
    """One request to both managers: look up, touch, pin the hits when ``load``, store
    the misses (``ok``: whether the store succeeds), touch again. Returns the request's
    keys and its hits; pinned hits stay pinned (the caller completes the load)."""
    keys = [block_key(i) for i in dict.fromkeys(ids)]
    hit = real.lookup(keys)
    assert twin.lookup(keys) == hit
    for m in (real, twin):
        m.touch(keys)
        if load and hit:
            m.prepare_load(keys[:hit])
    out = real.prepare_store(keys[hit:])
    assert twin.prepare_store(keys[hit:]) == out
    for m in (real, twin):
        m.touch(keys)
        if out is not None:
            m.complete_store(out.block_hashes_to_store, success=ok)
    return keys, hit


def serve_one(m: TierManager, ids: list[int]) -> int:
    """One request to one manager, as the replay serves it (``serve_request``).
    Returns its prefix hit."""
    return serve_request(m, [block_key(i) for i in ids])
