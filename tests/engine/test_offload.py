"""The engine with kvtier offloading end to end: same tokens, real hits, failures recompute.

Every test serves conversations through a GPU pool too small to keep them, so their
pages are evicted and come back from the CPU (or disk) tier, and compares the greedy
tokens with those of an engine without offloading.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier.blocks import Medium
from kvtier.connector.worker_half import ConnectorWorker
from kvtier.engine import LLM
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.errors import ConfigError
from kvtier.media.disk_layout import LAYOUT, listed_blocks
from tests.byte_oracle import install_recorder

from .workload import GPU_BLOCKS, PAGE, chats


def serve(
    model: Any, offload: Mapping[str, Any] | None, prompts: list[list[int]], block_size: int = PAGE
) -> tuple[list[list[int]], dict[str, int], LLM]:
    llm = LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=block_size, offload=offload)
    recorder = install_recorder(llm) if offload is not None else None
    outs: list[list[int]] = []
    totals = {"loaded": 0, "stored": 0, "failed_loads": 0, "cpu_hits": 0, "disk_hits": 0}
    for p in prompts:
        outs += llm.generate([p], max_new_tokens=4)
        st = llm.last_stats
        assert st is not None
        totals["loaded"] += st.offload.loaded_blocks
        totals["stored"] += st.offload.stored_blocks
        totals["failed_loads"] += st.offload.failed_loads
        totals["cpu_hits"] += st.offload.hit_blocks.get(Medium.CPU, 0)
        totals["disk_hits"] += st.offload.hit_blocks.get(Medium.DISK, 0)
    if recorder is not None:  # the byte oracle: every page loaded is the page stored
        assert recorder.mismatches == []
        assert recorder.pages_checked >= totals["loaded"]
    return outs, totals, llm


def close(llm: LLM) -> None:
    assert isinstance(llm.connector, OffloadingConnector)
    llm.close()


@pytest.mark.parametrize(
    ("store_policy", "block_size"),
    [("eager", 4), ("eager", 8), ("eager", 16), ("on_evict", 4), ("reuse", 4), ("reuse", 8)],
)
@pytest.mark.parametrize("eviction_policy", ["lru", "arc", "slru"])
def test_same_tokens_with_offloading(
    tiny_model: Any,
    baseline: list[list[int]],
    store_policy: str,
    block_size: int,
    eviction_policy: str,
) -> None:
    cfg = {
        "cpu_bytes_to_use": "8MiB",
        "block_size": block_size,
        "store_policy": store_policy,
        "eviction_policy": eviction_policy,
    }
    outs, totals, llm = serve(tiny_model, cfg, chats())
    close(llm)
    assert outs == baseline
    assert totals["loaded"] > 0, "no turn came back from the CPU tier"
    assert totals["cpu_hits"] == totals["loaded"]
    assert totals["failed_loads"] == 0


def test_requests_sharing_a_prefix_hit_it(tiny_model: Any) -> None:
    rng = random.Random(3)
    prefix = [rng.randrange(512) for _ in range(120)]
    offload = {"cpu_bytes_to_use": "8MiB", "block_size": PAGE}
    llm = LLM(model=tiny_model, num_gpu_blocks=40, block_size=PAGE, offload=offload)
    llm.generate([[*prefix, 1, 2, 3]], max_new_tokens=2)
    llm.generate([[rng.randrange(512) for _ in range(130)]], max_new_tokens=2)  # evicts it
    llm.generate([[*prefix, 7, 8, 9]], max_new_tokens=2)
    st = llm.last_stats
    assert st is not None
    close(llm)
    req = st.requests[0]
    assert req.gpu_hit_blocks > 0, "the head of the prefix is still in the GPU cache"
    assert req.gpu_hit_blocks + req.external_hit_blocks == 120 // PAGE
    assert st.offload.loaded_blocks == req.external_hit_blocks
    assert st.offload.bytes_loaded == req.external_hit_blocks * llm.pool.bytes_per_block
    assert req.computed_tokens == 3


class GarbageThenFail:
    """A copier that scribbles over the destination GPU pages, then raises."""

    def __init__(self, kv_caches: list[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        self.calls = 0

    def copy(self, plan: Any, gpu_to_cpu: bool) -> None:
        self.calls += 1
        rows = torch.from_numpy(plan.gpu_rows)
        for t in self.kv_caches:
            t[:, rows] = torch.randn_like(t[:, rows]) * 100
        raise RuntimeError("injected load failure")


def test_failed_loads_recompute_the_same_tokens(tiny_model: Any, baseline: list[list[int]]) -> None:
    llm = LLM(
        model=tiny_model,
        num_gpu_blocks=GPU_BLOCKS,
        block_size=PAGE,
        offload={"cpu_bytes_to_use": "8MiB"},
    )
    assert isinstance(llm.connector, OffloadingConnector)
    assert isinstance(llm.connector.worker, ConnectorWorker)
    handler = llm.connector.worker.worker._handlers[(Medium.CPU, Medium.GPU)]
    saboteur = GarbageThenFail(llm.pool.kv_caches)
    handler._copier = saboteur  # type: ignore[attr-defined]
    outs, failed = [], 0
    for p in chats():
        outs += llm.generate([p], max_new_tokens=4)
        assert llm.last_stats is not None
        failed += llm.last_stats.offload.failed_loads
        assert llm.last_stats.offload.loaded_blocks == 0
    close(llm)
    assert saboteur.calls > 0 and failed > 0
    assert outs == baseline


def disk_cfg(path: Path) -> dict[str, Any]:
    # A CPU tier of a few blocks: most returning turns come back from disk.
    return {
        "cpu_bytes_to_use": 6 * 4096,
        "block_size": PAGE,
        "disk_path": str(path),
        "disk_bytes_to_use": "16MiB",
    }


def test_cpu_and_disk_tiers_same_tokens_and_disk_hits(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    outs, totals, llm = serve(tiny_model, disk_cfg(tmp_path), chats())
    close(llm)
    assert outs == baseline
    assert totals["disk_hits"] > 0, totals
    assert totals["failed_loads"] == 0


def test_disk_tier_persists_across_engines(tiny_model: Any, tmp_path: Path) -> None:
    prompt = chats()[-1]
    first = LLM(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=disk_cfg(tmp_path)
    )
    expect = first.generate([prompt], max_new_tokens=4)
    first.close()  # flushes the write-through queue to disk
    second = LLM(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=disk_cfg(tmp_path)
    )
    assert second.generate([prompt], max_new_tokens=4) == expect
    st = second.last_stats
    assert st is not None
    close(second)
    assert st.offload.hit_blocks.get(Medium.DISK, 0) > 0


def test_corrupt_disk_blocks_are_recomputed(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    llm = LLM(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=disk_cfg(tmp_path)
    )
    outs, failed = [], 0
    for i, p in enumerate(chats()):
        if i % 3 == 2:  # flip a payload byte of every block's slot (4 KiB header)
            for fp_dir in (tmp_path / LAYOUT).iterdir():
                for block in listed_blocks(fp_dir):
                    with open(block.segment, "r+b") as f:
                        f.seek(block.offset + 5000)
                        byte = f.read(1)[0]
                        f.seek(block.offset + 5000)
                        f.write(bytes([byte ^ 0xFF]))
        outs += llm.generate([p], max_new_tokens=4)
        assert llm.last_stats is not None
        failed += llm.last_stats.offload.failed_loads
    close(llm)
    assert outs == baseline
    assert failed > 0


@pytest.mark.parametrize(
    ("offload", "key"),
    [
        ({"cpu_bytes_to_use": "1GiB", "block_sise": 16}, "block_sise"),
        ({"cpu_bytes_to_use": "1GiB", "block_size": 6}, "block_size"),
        ({"cpu_bytes_to_use": "1GiB", "block_size": 8, "store_policy": "on_evict"}, "store_policy"),
        ({"cpu_bytes_to_use": 100}, "cpu_bytes_to_use"),
        ({"block_size": 16}, "cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": "1GiB", "disk_path": "/tmp/x"}, "disk_bytes_to_use"),
    ],
)
def test_bad_offload_configuration_names_the_key(
    tiny_model: Any, offload: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        LLM(model=tiny_model, num_gpu_blocks=8, block_size=PAGE, offload=offload)
    assert err.value.key == key


def test_stores_that_do_not_fit_are_counted_and_the_head_is_kept(
    tiny_model: Any, baseline: list[list[int]]
) -> None:
    # A CPU tier of 8 blocks, prompts of up to 30 pages: the leading blocks that fit
    # are stored, the rest are counted as refused, and the tokens do not change.
    cfg = {"cpu_bytes_to_use": 8 * 2048, "block_size": PAGE}
    llm = LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg)
    outs, refused, stored = [], 0, 0
    for p in chats():
        outs += llm.generate([p], max_new_tokens=4)
        assert llm.last_stats is not None
        refused += llm.last_stats.offload.refused_stores
        stored += llm.last_stats.offload.stored_blocks
    close(llm)
    assert outs == baseline
    assert refused > 0 and stored > 0


def test_offload_stats_add_up_per_tier() -> None:
    from kvtier.engine.connector_api import OffloadStats

    a = OffloadStats(hit_blocks={Medium.CPU: 2}, loaded_blocks=2, refused_stores=1)
    b = OffloadStats(hit_blocks={Medium.CPU: 1, Medium.DISK: 4}, loaded_blocks=5)
    total = a + b
    assert total.hit_blocks == {Medium.CPU: 3, Medium.DISK: 4}
    assert (total.loaded_blocks, total.refused_stores, total.failed_loads) == (7, 1, 0)
