"""Several KV cache groups under kvtier's vLLM spec, without an engine.

A hybrid model (sliding-window and full-attention layers, Mamba state and attention)
has one KV cache group per kind of layer, and vLLM names each block once per group
(its ``OffloadKey`` ends with the group index). These tests pin what kvtier does with
that, piece by piece: a job's pages, group after group (``worker.plan_job``); each
group's request read from vLLM's request context (``RequestKeys``); the manager
answering per group; the storage fingerprint naming the group layout. The engine tests
(``test_vllm_hybrid.py``) run it end to end.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvtier.blocks import BlockHash
from kvtier.integrations.vllm.identity import group_layout, storage_fingerprint
from kvtier.integrations.vllm.requests import RequestKeys
from tests.integrations.vllm_support import require_vllm


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


# -- plan_job: a job's pages, group after group -----------------------------------------


def plan(**kw: Any) -> Any:
    require_vllm()
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


# -- RequestKeys: each group's request ---------------------------------------------------


def test_each_group_is_its_own_request_in_prefix_order() -> None:
    keys = RequestKeys()
    ctx = Context("r", recorded(chunks=4, groups=3))
    for g in range(3):
        got = keys.of(ctx, BlockHash(key(2, g))).keys
        assert got == [key(i, g) for i in range(4)]


def test_a_sliding_group_looked_up_from_the_right_is_admitted_where_vllm_stopped() -> None:
    """vLLM looks up the full group first, from its GPU cache's end (2 blocks here),
    then the sliding group from the right: the sliding group is admitted with the same
    2 blocks served, not with every block before its first looked-up key."""
    keys = RequestKeys()
    ctx = Context("r", recorded(chunks=5, groups=2))
    full = keys.admit(ctx, BlockHash(key(2, 1)))
    assert full is not None and full[1] == 2
    sliding = keys.admit(ctx, BlockHash(key(4, 0)))
    assert sliding is not None and sliding[1] == 2
    assert sliding[0].keys == [key(i, 0) for i in range(5)]
    assert keys.admit(ctx, BlockHash(key(3, 0))) is None  # once per group


def test_a_partial_tail_key_is_not_a_block_of_the_prefix() -> None:
    """vLLM records a partial-tail key (a boundary inside a block) when it looks it up,
    after the request's blocks: it is not one of them."""
    positions = recorded(chunks=3, groups=1)
    positions[key(9, 0)] = 40
    keys = RequestKeys()
    assert keys.of(Context("r", positions), BlockHash(key(0, 0))).keys == [
        key(i, 0) for i in range(3)
    ]


# -- the manager, per group --------------------------------------------------------------


def test_the_manager_serves_every_group_and_counts_loads_per_group(tmp_path: Path) -> None:
    require_vllm()
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


# -- the storage fingerprint names the group layout --------------------------------------


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


def fingerprint(groups: list[tuple[int, int, list[str]]]) -> bytes:
    return storage_fingerprint(
        offloading_config(groups),
        layout="vllm-pages/4096B",
        ranks="rank0",
        block_size=32,
        weights="w",
        identity="",
        engine="vllm",
    )


def test_another_grouping_of_the_layers_is_another_fingerprint() -> None:
    """Gemma 2-style (sliding, full, sliding, full) against the same four layers
    grouped as Gemma 3-style windows would group them: the groups' keys are equal
    (same block hashes, same group indices), so only the fingerprint keeps them apart."""
    alternating = [(0, 32, ["l.0", "l.2"]), (1, 32, ["l.1", "l.3"])]
    mostly_sliding = [(0, 32, ["l.0", "l.1", "l.2"]), (1, 32, ["l.3"])]
    assert group_layout(offloading_config(alternating)) == "0:32:l.0,l.2|1:32:l.1,l.3"
    assert fingerprint(alternating) != fingerprint(mostly_sliding)
    assert fingerprint(alternating) == fingerprint(list(alternating))
    assert fingerprint(alternating) != fingerprint(
        [(0, 64, ["l.0", "l.2"]), (1, 32, ["l.1", "l.3"])]
    )


def test_a_model_of_windowed_groups_only_is_found_windowed_by_its_second_lookup() -> None:
    """Without a full-attention group vLLM's first lookup is a window's rightmost block:
    where vLLM's own cache stopped is not known then, and the group is found windowed
    when vLLM looks up a block to its left."""
    keys = RequestKeys()
    ctx = Context("r", recorded(chunks=5, groups=1))
    admitted = keys.admit(ctx, BlockHash(key(4, 0)))
    assert admitted is not None and admitted[1] == 4 and not admitted[0].windowed
    request = keys.of(ctx, BlockHash(key(3, 0)))
    assert request.looked_up(BlockHash(key(3, 0))) is True
    assert request.windowed and request.first_looked == 4
    assert request.looked_up(BlockHash(key(2, 0))) is False  # found once


# -- WindowChecks: every block of a window Redis holds -----------------------------------


class FakeShared:
    """A shared store holding ``held``; ``outages`` counts simulated outages."""

    def __init__(self, held: set[bytes]) -> None:
        self.held = held
        self.outages = 0
        self.asked: list[list[bytes]] = []

    def exists_many(self, keys: Any) -> list[bool]:
        self.asked.append(list(keys))
        return [k in self.held for k in keys]


def remote_index() -> Any:
    from kvtier.scheduler import CPUOffloadingManager

    return CPUOffloadingManager(num_blocks=16, block_size=32, eviction_policy="lru")


def test_window_checks_adopt_every_block_found_not_only_a_leading_run() -> None:
    """Windows are sparse: blocks 3 and 4 of a request whose blocks 0-2 were never
    stored. The tiering's discovery adopts a leading run (none here); these checks
    adopt both."""
    from kvtier.integrations.vllm.windows import WindowChecks

    blocks = [BlockHash(key(i, 0)) for i in range(5)]
    store = FakeShared({blocks[3], blocks[4]})
    index = remote_index()
    checks = WindowChecks(store, index)
    try:
        assert checks.ask(("r", b"g"), blocks) is True
        assert checks.ask(("r", b"g"), blocks) is False  # once per request and group
        checks.wait()
        assert not checks.asking(("r", b"g"))
        checks.adopt()
        assert sorted(index.keys()) == sorted([blocks[3], blocks[4]])
        assert store.asked == [blocks]
    finally:
        checks.shutdown()


def test_window_checks_answered_across_an_outage_are_dropped() -> None:
    from kvtier.integrations.vllm.windows import WindowChecks

    blocks = [BlockHash(key(i, 0)) for i in range(3)]
    store = FakeShared(set(blocks))
    index = remote_index()
    checks = WindowChecks(store, index)
    try:
        checks.ask(("r", b"g"), blocks)
        checks.wait()
        store.outages += 1  # Redis restarted after the check: its answer may be stale
        checks.adopt()
        assert index.keys() == []
    finally:
        checks.shutdown()


def test_the_start_up_log_names_every_group() -> None:
    require_vllm()
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
