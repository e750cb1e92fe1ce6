"""Under vLLM the policies see whole requests, exactly as ``kvtier simulate`` shows them.

vLLM asks the manager about one key at a time. ``KvtierManager`` assembles each
request from vLLM's request context, so a trace replayed through the vLLM manager API
-- per-key lookups until the first miss, a load of the hits, a store of the rest, as
vLLM's connector calls them -- hits exactly what ``kvtier simulate``'s replay of the
same trace hits, for every policy, the request-learning ones included. Runs in both
vLLM environments (it needs vLLM's request context, no engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvtier.sim.replay import replay
from kvtier.sim.trace import Trace, read_mooncake
from kvtier.sim.traces import SYNTHETIC_TRACE
from tests.integrations.vllm_support import require_vllm

GROUP = (0).to_bytes(4, "big")


@pytest.fixture(scope="module")
def trace() -> Trace:
    full = read_mooncake(SYNTHETIC_TRACE)
    return Trace(
        requests=full.requests[:600],
        block_size=full.block_size,
        source="the shipped trace's first 600 requests",
        num_block_refs=sum(len(r.keys) for r in full.requests[:600]),
        num_distinct_blocks=len({k for r in full.requests[:600] for k in r.keys}),
    )


def replay_through_vllm(trace: Trace, capacity: int, policy: str, shm: Path) -> int:
    """Serve ``trace`` through ``KvtierManager`` as vLLM's connector calls it; the hits."""
    require_vllm()
    from kvtier.integrations.vllm import compat
    from kvtier.integrations.vllm.manager import KvtierManager
    from kvtier.integrations.vllm.region import HostRegion, RegionLayout
    from kvtier.scheduler import CPUOffloadingManager

    cpu = CPUOffloadingManager(
        num_blocks=capacity, block_size=trace.block_size, eviction_policy=policy
    )
    region = HostRegion.open(shm / f"{policy}-{capacity}.slab", RegionLayout(capacity, 8, 1))
    m = KvtierManager(cpu, None, region, on_shutdown=region.close)
    hits = 0
    try:
        for i, request in enumerate(trace.requests):
            ctx: Any = compat.ReqContext(req_id=f"r{i}")
            keys = [compat.OffloadKey(bytes(k) + GROUP) for k in request.keys]
            m.on_new_request(ctx)
            for j, key in enumerate(keys):  # what vLLM records before it looks up
                ctx.set_offload_key_position(key, (j + 1) * trace.block_size)
            hit = 0
            for key in keys:
                if m.lookup(key, ctx) is not compat.LookupResult.HIT:
                    break
                hit += 1
            if hit:
                m.prepare_load(keys[:hit], ctx)
                m.complete_load(keys[:hit], ctx)
            out = m.prepare_store(keys[hit:], ctx)
            if out is not None:
                m.complete_store(out.keys_to_store, ctx)
            m.on_request_finished(ctx)
            hits += hit
    finally:
        m.shutdown()
    return hits


@pytest.mark.parametrize("policy", ["lru", "arc", "slru", "density", "leader"])
@pytest.mark.parametrize("share", [0.01, 0.05, 0.25])
def test_a_trace_hits_the_same_through_vllms_manager_api_as_in_simulate(
    trace: Trace, policy: str, share: float, tmp_path: Path
) -> None:
    capacity = max(1, round(share * trace.num_distinct_blocks))
    expected = replay(trace, capacity, policy).ratios.hit_blocks
    assert expected > 0
    assert replay_through_vllm(trace, capacity, policy, tmp_path) == expected


def test_vllms_request_context_records_every_key_with_its_position() -> None:
    """The pinned exception: the manager reads the request's keys from the context's
    ``_offload_key_positions`` (vLLM has no public accessor for all of them). If a
    vLLM release renames or reshapes it, this fails, and requests fall back to the
    keys vLLM looks up (logged once)."""
    require_vllm()
    from kvtier.integrations.vllm import compat

    ctx: Any = compat.ReqContext(req_id="r")
    keys = [compat.OffloadKey(bytes([i]) * 8 + GROUP) for i in range(3)]
    for j, key in enumerate(keys):
        ctx.set_offload_key_position(key, (j + 1) * 16)
    assert ctx._offload_key_positions == {k: (j + 1) * 16 for j, k in enumerate(keys)}
    assert list(ctx._offload_key_positions) == keys  # recorded in order
