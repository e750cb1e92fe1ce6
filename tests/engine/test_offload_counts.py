"""Exact block counts of the offloading engine on its fixed chat workload.

The engine, the tiny model and the workload are deterministic, so what the connector
stores, finds and loads is an exact figure per store policy and eviction policy, not
"more than zero". Every run also goes through the byte recorder (``tests/byte_oracle``):
each page loaded is the page that was stored, and it checked exactly the pages loaded.

Figures were taken from the engine at commit 0e1e267 (connector halves) and checked for consistency:
hits are loads (nothing fails), GPU prefix hits do not depend on offloading, and the
recorder saw every stored page. A change that moves one must say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvtier.blocks import Medium
from kvtier.engine import LLM
from tests.byte_oracle import ByteRecorder, install_recorder

from .workload import GPU_BLOCKS, PAGE, chats

BLOCK_BYTES = 2048  # one 4-token page of the tiny model: 2 layers x K,V x 2 heads x 16 x fp32
UNBOUNDED = "8MiB"  # 4,096 blocks: the workload never fills it


@dataclass(frozen=True)
class Counts:
    """Over the 12 turns: offloaded blocks stored and loaded, GPU pages found offloaded
    (``external``) and served by the GPU prefix cache, blocks refused by the tier."""

    stored: int
    loaded: int
    external: int
    gpu_hits: int
    refused_stores: int = 0


def serve(model: Any, offload: dict[str, Any]) -> tuple[Counts, ByteRecorder, list[list[int]]]:
    llm = LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=offload)
    recorder = install_recorder(llm)
    outs: list[list[int]] = []
    stored = loaded = gpu_hits = refused = cpu_hits = external = failed = 0
    for prompt in chats():
        outs += llm.generate([prompt], max_new_tokens=4)
        st = llm.last_stats
        assert st is not None
        stored += st.offload.stored_blocks
        loaded += st.offload.loaded_blocks
        refused += st.offload.refused_stores
        failed += st.offload.failed_loads + st.offload.failed_stores
        cpu_hits += st.offload.hit_blocks.get(Medium.CPU, 0)
        external += sum(r.external_hit_blocks for r in st.requests)
        gpu_hits += st.gpu_hit_blocks
    llm.close()
    f = offload["block_size"] // PAGE
    assert failed == 0
    assert cpu_hits == loaded, "every offloaded hit was loaded"
    assert recorder.mismatches == []
    assert recorder.pages_checked == external, "the recorder checked every page loaded"
    assert recorder.pages_stored == stored * f
    return Counts(stored, loaded, external, gpu_hits, refused), recorder, outs


# (store policy, eviction policy, CPU tier bytes, offloaded block size) -> counts
EXPECTED = {
    # A tier that never fills: the store policy alone decides.
    ("eager", "lru", UNBOUNDED, 4): Counts(stored=85, loaded=51, external=51, gpu_hits=109),
    ("on_evict", "lru", UNBOUNDED, 4): Counts(stored=67, loaded=51, external=51, gpu_hits=109),
    # reuse: a block is stored on its second use, GPU prefix hits included; without
    # counting those, loads fall to 5 (issue 19).
    ("reuse", "lru", UNBOUNDED, 4): Counts(stored=51, loaded=19, external=19, gpu_hits=109),
    # Offloaded blocks of 2 and 4 pages: a load may start inside a block, so more
    # pages come back than whole blocks (48 pages out of 27 blocks).
    ("eager", "lru", UNBOUNDED, 8): Counts(stored=42, loaded=27, external=48, gpu_hits=109),
    ("reuse", "lru", UNBOUNDED, 8): Counts(stored=26, loaded=11, external=18, gpu_hits=109),
    ("eager", "lru", UNBOUNDED, 16): Counts(stored=20, loaded=12, external=40, gpu_hits=109),
    # 64 blocks, eager: ARC and SLRU find more than LRU.
    ("eager", "lru", 64 * BLOCK_BYTES, 4): Counts(stored=93, loaded=33, external=33, gpu_hits=109),
    ("eager", "arc", 64 * BLOCK_BYTES, 4): Counts(stored=92, loaded=40, external=40, gpu_hits=109),
    ("eager", "slru", 64 * BLOCK_BYTES, 4): Counts(stored=92, loaded=40, external=40, gpu_hits=109),
    # 32 blocks, on_evict: here LRU finds more.
    ("on_evict", "lru", 32 * BLOCK_BYTES, 4): Counts(96, 39, 39, 109),
    ("on_evict", "arc", 32 * BLOCK_BYTES, 4): Counts(77, 26, 26, 109),
    ("on_evict", "slru", 32 * BLOCK_BYTES, 4): Counts(77, 26, 26, 109),
    # 24 blocks, eager: a prompt's new blocks can outnumber the tier; those that do
    # not fit are refused.
    ("eager", "lru", 24 * BLOCK_BYTES, 4): Counts(140, 0, 0, 109, refused_stores=8),
}


@pytest.mark.parametrize(
    ("store_policy", "eviction_policy", "cpu_bytes", "block_size"), list(EXPECTED)
)
def test_exact_counts(
    tiny_model: Any,
    baseline: list[list[int]],
    store_policy: str,
    eviction_policy: str,
    cpu_bytes: int | str,
    block_size: int,
) -> None:
    offload = {
        "cpu_bytes_to_use": cpu_bytes,
        "block_size": block_size,
        "store_policy": store_policy,
        "eviction_policy": eviction_policy,
    }
    counts, _, outs = serve(tiny_model, offload)
    assert outs == baseline
    assert counts == EXPECTED[store_policy, eviction_policy, cpu_bytes, block_size]
