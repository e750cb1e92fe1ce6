"""Belady's rule, checked against brute force on tiny traces.

Two brute forces: (1) the same rule computed naively (scan the future for every
resident block at each eviction) must give the same hits exactly; (2) an exhaustive
search over every eviction choice, counting every block access that finds its block
resident, must never beat Belady -- farthest-next-use is optimal for demand paging.
"""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.sim.belady import belady, next_use_positions
from kvtier.sim.trace import Trace, trace_from_requests


def _trace(requests: list[list[int]]) -> Trace:
    return trace_from_requests(
        [(float(i), 4 * len(ids), 1, ids) for i, ids in enumerate(requests)], block_size=4
    )


def _naive_belady_prefix_hits(requests: list[list[int]], capacity: int) -> int:
    flat = [hid for ids in requests for hid in ids]
    resident: set[int] = set()
    hits = 0
    position = 0
    for ids in requests:
        for hid in ids:
            if hid not in resident:
                break
            hits += 1
        for hid in ids:
            position += 1
            if capacity == 0 or hid in resident:
                continue
            if len(resident) >= capacity:

                def next_use(block: int, after: int = position) -> int:
                    rest = flat[after:]
                    return rest.index(block) if block in rest else len(flat)

                resident.remove(max(sorted(resident), key=next_use))
            resident.add(hid)
    return hits


def _optimal_access_hits(flat: tuple[int, ...], capacity: int) -> int:
    @cache
    def best(position: int, resident: frozenset[int]) -> int:
        if position == len(flat):
            return 0
        hid = flat[position]
        if hid in resident:
            return 1 + best(position + 1, resident)
        if len(resident) < capacity:
            return best(position + 1, resident | {hid})
        return max(best(position + 1, (resident - {victim}) | {hid}) for victim in resident)

    return best(0, frozenset())


def _belady_access_hits(flat: list[int], capacity: int) -> int:
    trace = _trace([[hid] for hid in flat])  # one block per request: prefix hit == access hit
    return belady(trace, capacity).hit_blocks


requests_st = st.lists(
    st.lists(st.integers(0, 7), min_size=0, max_size=4, unique=True), min_size=0, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(requests=requests_st, capacity=st.integers(0, 5))
def test_matches_naive_farthest_next_use(requests: list[list[int]], capacity: int) -> None:
    assert belady(_trace(requests), capacity).hit_blocks == _naive_belady_prefix_hits(
        requests, capacity
    )


@settings(max_examples=150, deadline=None)
@given(flat=st.lists(st.integers(0, 5), max_size=11), capacity=st.integers(1, 3))
def test_optimal_for_demand_paging(flat: list[int], capacity: int) -> None:
    assert _belady_access_hits(flat, capacity) == _optimal_access_hits(tuple(flat), capacity)


def test_next_use_positions() -> None:
    trace = _trace([[1, 2], [1, 3], [2]])
    # accesses: 1 2 1 3 2  (positions 0..4); 5 = never again
    assert next_use_positions(trace) == [2, 4, 5, 5, 5]


def test_evicts_the_child_before_its_parent() -> None:
    # capacity 2: after [1, 2] comes 3, evicting 2 (used after 1); then [1, 2] hits block 1.
    trace = _trace([[1, 2], [3], [1, 2]])
    assert belady(trace, 2).hit_blocks == 1


def test_zero_capacity_hits_nothing() -> None:
    assert belady(_trace([[1], [1]]), 0).hit_blocks == 0
