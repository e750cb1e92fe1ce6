"""Several KV cache groups under kvtier's vLLM spec, the parts that import vLLM: a
job's pages group after group (``worker.plan_job``), the manager answering per group,
the start-up log naming the groups. The rest is ``test_vllm_groups.py`` (no vLLM);
the engine tests (``test_vllm_hybrid.py``) run it end to end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integrations.vllm_groups_support import offloading_config, recorded

# -- plan_job: a job's pages, group after group -----------------------------------------


def plan(**kw: Any) -> Any:
    from kvtier.integrations.vllm.worker import plan_job

    kw.setdefault("num_gpu_blocks", 64)
    kw.setdefault("num_cpu_blocks", 16)
    kw.setdefault("gpu_is_dst", True)
    return plan_job(**kw)


def test_each_group_takes_its_own_offloaded_blocks_entered_at_its_own_index() -> None:
    """The docstring's example: group 1 starts mid-block (a sliding window's load)."""
    p = plan(
        gpu_block_ids=np.array([10, 11, 12, 20, 21]),
        group_sizes=[3, 2],
        block_indices=[0, 5],
        cpu_block_ids=np.array([4, 9, 7, 3]),
        factor=2,
    )
    assert p.gpu_rows.tolist() == [10, 11, 12, 20, 21]
    assert p.cpu_rows.tolist() == [8, 9, 18, 15, 6]


def test_a_group_without_blocks_takes_no_offloaded_block() -> None:
    p = plan(
        gpu_block_ids=np.array([5, 6]),
        group_sizes=[0, 2, 0],
        block_indices=[0, 4, 0],
        cpu_block_ids=np.array([2]),
        factor=2,
    )
    assert p.gpu_rows.tolist() == [5, 6]
    assert p.cpu_rows.tolist() == [4, 5]


@pytest.mark.parametrize(
    ("sizes", "indices", "cpu_ids"),
    [
        ([2, 2], [0, 0], [1]),  # group 1's block is missing
        ([2, 2], [0, 0], [1, 2, 3]),  # one offloaded block too many
        ([2, 1], [0, 0], [1, 2]),  # sizes that do not add up to the GPU blocks
        ([4], [0, 0], [1, 2]),  # an index per group
    ],
)
def test_counts_that_do_not_fit_are_refused(
    sizes: list[int], indices: list[int], cpu_ids: list[int]
) -> None:
    from kvtier.errors import ProtocolError

    with pytest.raises(ProtocolError):
        plan(
            gpu_block_ids=np.array([1, 2, 3, 4]),
            group_sizes=sizes,
            block_indices=indices,
            cpu_block_ids=np.array(cpu_ids),
            factor=2,
        )


def test_two_groups_writing_one_page_are_refused() -> None:
    from kvtier.errors import ProtocolError

    with pytest.raises(ProtocolError, match="twice"):
        plan(
            gpu_block_ids=np.array([1, 2]),
            group_sizes=[1, 1],
            block_indices=[0, 0],
            cpu_block_ids=np.array([3, 3]),
            factor=1,
            gpu_is_dst=False,
        )


# -- the manager, per group --------------------------------------------------------------


def test_the_manager_serves_every_group_and_counts_loads_per_group(tmp_path: Path) -> None:
    from kvtier.integrations.vllm import compat
    from kvtier.integrations.vllm.manager import KvtierManager
    from kvtier.integrations.vllm.metrics import LOADED_BLOCKS
    from kvtier.integrations.vllm.region import HostRegion, RegionLayout
    from kvtier.scheduler import CPUOffloadingManager

    cpu = CPUOffloadingManager(num_blocks=16, block_size=32, eviction_policy="lru")
    region = HostRegion.open(tmp_path / "r.slab", RegionLayout(16, 8, 1))
    m = KvtierManager(cpu, None, region, on_shutdown=region.close)
    try:
        first = compat.ReqContext(req_id="a")
        first._offload_key_positions.update(recorded(chunks=3, groups=2))
        all_keys = [compat.OffloadKey(k) for k in first._offload_key_positions]
        out = m.prepare_store(all_keys, first)
        assert out is not None and len(out.keys_to_store) == 6
        m.complete_store(out.keys_to_store, first)
        again = compat.ReqContext(req_id="b")
        again._offload_key_positions.update(first._offload_key_positions)
        results = [m.lookup(k, again) for k in all_keys]
        assert results == [compat.LookupResult.HIT] * 6
        # A sliding group (0) needs only its window: its last block.
        m.prepare_load([all_keys[2], *all_keys[3:]], again)
        assert m.metrics.total(LOADED_BLOCKS, ("0",)) == 1
        assert m.metrics.total(LOADED_BLOCKS, ("1",)) == 3
    finally:
        m.shutdown()


# -- the start-up log ---------------------------------------------------------------------


def test_the_start_up_log_names_every_group() -> None:
    from kvtier.integrations.vllm.spec import describe_groups

    config = offloading_config([(0, 32, ["l.0", "l.2"]), (1, 32, ["l.1", "l.3"])])
    assert describe_groups(config) == (
        "2 KV cache group(s): group 0 (l.0, l.2; 32 tokens a block); "
        "group 1 (l.1, l.3; 32 tokens a block)"
    )
    for g, window in zip(config.groups, (2, None), strict=True):
        g.sliding_window_size_in_chunks = window  # what vLLM 0.33 adds
    assert "group 0 (l.0, l.2; 32 tokens a block, a window of 2 offloaded block(s))" in (
        describe_groups(config)
    )
    assert "group 1 (l.1, l.3; 32 tokens a block, full attention)" in describe_groups(config)
