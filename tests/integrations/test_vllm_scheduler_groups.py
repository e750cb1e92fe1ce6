"""vLLM 0.33's real Scheduler over kvtier's spec with a hybrid model's KV cache groups.

A sliding-window group (64 tokens: two blocks) and a full-attention group share one
pool of GPU pages, TP=2 on CPU tensors (``vllm_harness``). The harness's byte oracle
names the group in every row, so a page of one group loaded into another, or a window
loaded one block off, fails the test; it checks a sliding group's rows where its window
needs them and a full group's everywhere. Runs in the vLLM 0.33 environment.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtier.integrations.vllm.metrics import LOADED_BLOCKS, LOOKUPS

pytestmark = pytest.mark.slow

WINDOW = 64
DOC_BLOCKS = 5


@pytest.fixture
def hybrid(model_dir: Path) -> Iterator[Any]:
    from tests.integrations.vllm_harness import Harness

    built: list[Any] = []

    def make(extra: dict[str, Any], **kw: Any) -> Any:
        h = Harness.build(
            model_dir,
            {
                "spec_name": "KvtierOffloadingSpec",
                "spec_module_path": "kvtier.integrations.vllm",
                **extra,
            },
            engine_id=f"kvtier-groups-{os.getpid()}-{len(built)}",
            windows=[WINDOW, None],
            # Prefills of two blocks a step: vLLM stores a sliding group's window at
            # each step's end, so prefixes shorter than a document hit too.
            max_num_batched_tokens=64,
            **kw,
        )
        built.append(h)
        return h

    yield make
    for h in built:
        h.shutdown()


def docs_workload(h: Any, num_requests: int, seed: int = 0) -> None:
    """Requests over 6 shared documents of 5 blocks: each the first 1 to 5 blocks of a
    document and its own 20-token tail (so loads start and end where stores did not)."""
    rng = random.Random(seed)
    docs = [[rng.randrange(1, 500) for _ in range(DOC_BLOCKS * 32)] for _ in range(6)]
    for i in range(num_requests):
        tail = [rng.randrange(1, 500) for _ in range(20)]
        prefix = 32 * rng.randrange(1, DOC_BLOCKS + 1)
        h.add(f"r{i}", docs[rng.randrange(6)][:prefix] + tail, max_tokens=4)


def test_both_groups_come_back_from_kvtier_with_right_bytes(hybrid: Any) -> None:
    h = hybrid({"cpu_bytes_to_use": 96 * 2 * 16384, "eviction_policy": "lru"}, num_gpu_blocks=24)
    docs_workload(h, 40)
    h.run()
    m = h.manager
    # Deterministic: every job is waited for within its step.
    hits = m.metrics.total(LOOKUPS, ("hit",))
    sliding, full = (m.metrics.total(LOADED_BLOCKS, (g,)) for g in ("0", "1"))
    # A hit loads the sliding group's window (2 blocks) and every full block before it.
    assert (h.steps, hits, sliding, full) == (81, 331, 50, 69)
    assert h.checked_rows == 9414  # rows checked against the oracle before any compute


def test_a_window_loaded_one_block_off_is_caught_by_the_oracle(hybrid: Any) -> None:
    """The planted bug of the engine tests (``vllm_misaligned``) under vLLM 0.33's
    scheduler: the oracle names the wrong bytes."""
    h = hybrid(
        {
            "cpu_bytes_to_use": 96 * 2 * 16384,
            "spec_name": "MisalignedSpec",
            "spec_module_path": "tests.integrations.vllm_misaligned",
            "misalign_group": 0,
        },
        num_gpu_blocks=24,
    )
    docs_workload(h, 40)
    with pytest.raises(AssertionError, match=r"group 0: token \d+ .* holds wrong KV bytes"):
        h.run()


def test_kv_caches_kvtier_cannot_copy_are_refused_naming_the_groups(hybrid: Any) -> None:
    """A hybrid model's tensors in a layout kvtier does not copy (not one page per
    row): the refusal names the groups and vLLM's workaround."""
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    from kvtier.errors import ConfigError
    from tests.integrations.vllm_harness import PAGE

    h = hybrid({"cpu_bytes_to_use": 8 * 2 * 16384}, num_gpu_blocks=24)
    spec = h.ranks[0].connector.spec
    fresh = type(spec)(spec.config)  # a worker not yet built
    packed = torch.zeros((24, 2, PAGE // 2), dtype=torch.int8)  # not one page per row
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(packed, PAGE)],
        group_data_refs=[[CanonicalKVCacheRef(0, PAGE)], [CanonicalKVCacheRef(0, PAGE)]],
    )
    with pytest.raises(ConfigError) as refused:
        fresh.get_worker(caches)
    message = str(refused.value)
    assert message.count("config key 'kv_caches'") == 1
    assert "tensor 0 has shape (24, 2, 8192)" in message
    assert "2 KV cache group(s): group 0 (model.layers.0.self_attn.attn" in message
    assert "--disable-hybrid-kv-cache-manager" in message


def test_a_conversation_larger_than_the_cpu_tier_loads_what_the_tier_holds(
    hybrid: Any, tmp_path: Path
) -> None:
    """Both groups of a 16-block conversation on disk (32 blocks) behind a CPU tier of 8:
    the full group's run is promoted as far as leaves its window room (8 - 3: the window
    of 2 and one block more), and the sliding group's window where that run ends -- not
    at the prompt's end, where vLLM looks first -- so vLLM loads 5 + 2 blocks, right
    byte for byte. Without the room, or with the window promoted at the prompt's end,
    the window's promotions evict the run before vLLM loads it: nothing is loaded."""
    from tests.integrations.vllm_harness import conversation, write_turn_by_turn

    disk = {"disk_path": str(tmp_path / "disk"), "disk_bytes_to_use": "16MiB"}
    cpu = {"cpu_bytes_to_use": 8 * 2 * 16384}
    chat = conversation(16)
    writer = hybrid({**cpu, **disk}, num_gpu_blocks=48)
    write_turn_by_turn(writer, chat)
    assert len(writer.manager.tiered.secondaries[0]) == 32  # both groups of the chat
    writer.shutdown()
    h = hybrid({**cpu, **disk}, num_gpu_blocks=48)
    h.add("again", [*chat, 8], max_tokens=2)
    h.run()
    m = h.manager
    stats = m.tiered.stats()
    assert (stats.promotions, stats.promotion_failures) == (7, 0)
    sliding, full = (m.metrics.total(LOADED_BLOCKS, (g,)) for g in ("0", "1"))
    assert (sliding, full) == (2, 5)
    assert h.checked_rows == 446  # the loaded rows, checked against the oracle
