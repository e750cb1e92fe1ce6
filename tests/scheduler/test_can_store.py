"""``can_store`` asks before ``prepare_store`` acts: its answer is exactly the longest
head that ``prepare_store`` takes, for every policy, after any history of stores,
loads, failures and evictions (checked against the real call on a copy)."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
from hypothesis import given, settings

from kvtier.scheduler import POLICIES, CPUOffloadingManager
from kvtier.scheduler.manager import BlockState

UNIVERSE = [f"k{i}".encode() for i in range(12)]
key_lists = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=7)
ops = st.lists(
    st.tuples(st.sampled_from(["store", "fail", "load", "unload", "touch"]), key_lists),
    max_size=25,
)


def apply(m: CPUOffloadingManager, op: str, ks: list[bytes], pinned: list[list[bytes]]) -> None:
    if op == "store":
        n = m.can_store(ks)
        out = m.prepare_store(ks[:n])
        if out is not None:
            m.complete_store(out.block_hashes_to_store)
    elif op == "fail":
        out = m.prepare_store(ks[: m.can_store(ks)])
        if out is not None:
            m.complete_store(out.block_hashes_to_store, success=False)
    elif op == "load":
        ready = [k for k in dict.fromkeys(ks) if m.state(k) is BlockState.READY]
        if ready:
            m.prepare_load(ready)
            pinned.append(ready)
    elif op == "unload" and pinned:
        m.complete_load(pinned.pop(0))
    elif op == "touch":
        m.touch(ks)


def check(m: CPUOffloadingManager, ks: list[bytes]) -> None:
    n = m.can_store(ks)
    assert 0 <= n <= len(ks)
    assert copy.deepcopy(m).prepare_store(ks[:n]) is not None or n == 0
    if n < len(ks):
        assert copy.deepcopy(m).prepare_store(ks[: n + 1]) is None
    assert m._storing == {k for k in UNIVERSE if m.state(k) is BlockState.STORING}
    assert m._is_held.n_pinned == sum(1 for k in UNIVERSE if m.pins(k) > 0)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    threshold=st.sampled_from([0, 2]),
    history=ops,
    storing=key_lists,
    ask=key_lists,
)
def test_can_store_is_the_longest_head_prepare_store_takes(
    policy: str, threshold: int, history: list[tuple[str, list[bytes]]], storing, ask
) -> None:
    m = CPUOffloadingManager(
        num_blocks=4, block_size=4, eviction_policy=policy, store_threshold=threshold
    )
    pinned: list[list[bytes]] = []
    for op, ks in history:
        apply(m, op, ks, pinned)
        m.lookup(ks)  # counts uses, for reuse admission
    out = m.prepare_store(storing[: m.can_store(storing)])  # some blocks left STORING
    check(m, ask)
    assert out is None or all(m.state(k) is not None for k in out.block_hashes_to_store)


def test_a_promotion_head_stops_at_the_first_key_admission_skips() -> None:
    m = CPUOffloadingManager(num_blocks=4, block_size=4, store_threshold=2)
    a, b, c = b"a", b"b", b"c"
    m.lookup([a, b, c])
    m.lookup([a])  # a seen twice, b and c once
    assert m.can_store([a, b, c]) == 3  # b and c are skipped, not refused
    assert m.can_store([a, b, c], whole=True) == 1
