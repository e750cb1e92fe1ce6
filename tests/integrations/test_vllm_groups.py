"""Several KV cache groups under kvtier's vLLM spec, without vLLM.

A hybrid model (sliding-window and full-attention layers, Mamba state and attention)
has one KV cache group per kind of layer, and vLLM names each block once per group
(its ``OffloadKey`` ends with the group index). These tests pin what kvtier does with
that, piece by piece, in pure Python: each group's request read from vLLM's request
context (``RequestKeys``); the storage fingerprint naming the group layout; Redis's
window checks. ``test_vllm_group_jobs.py`` has the parts that import vLLM (a job's
pages, the manager per group); the engine tests (``test_vllm_hybrid.py``) run it end
to end.
"""

from __future__ import annotations

from typing import Any

from kvtier.blocks import BlockHash
from kvtier.integrations.vllm.identity import group_layout, storage_fingerprint
from kvtier.integrations.vllm.requests import RequestKeys
from tests.integrations.vllm_groups_support import Context, key, offloading_config, recorded

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


# -- the storage fingerprint names the group layout --------------------------------------


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
