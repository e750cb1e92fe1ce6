"""expand_block_ids, runs and job validation (pure index arithmetic)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ProtocolError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.worker.blockmap import RowPlan, expand_block_ids, plan_rows, repeats


def test_expand_seed_example() -> None:
    out = expand_block_ids([0, 1, 3], 4)
    assert out.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    assert out.dtype == np.int64


def test_expand_skip_drops_first_sub_blocks_of_first_block_only() -> None:
    assert expand_block_ids([7, 2], 4, skip_count=1).tolist() == [29, 30, 31, 8, 9, 10, 11]
    assert expand_block_ids([7, 2], 4, skip_count=3).tolist() == [31, 8, 9, 10, 11]


def test_expand_factor_one_is_identity() -> None:
    assert expand_block_ids([5, 0, 9], 1).tolist() == [5, 0, 9]


def test_expand_empty() -> None:
    assert expand_block_ids([], 4).tolist() == []


@pytest.mark.parametrize(("factor", "skip"), [(4, 4), (4, -1), (1, 1), (0, 0)])
def test_expand_rejects_bad_arguments(factor: int, skip: int) -> None:
    with pytest.raises(ProtocolError):
        expand_block_ids([1], factor, skip_count=skip)


def test_expand_empty_rejects_skip() -> None:
    with pytest.raises(ProtocolError, match="skip_count"):
        expand_block_ids([], 4, skip_count=1)


@given(
    ids=st.lists(st.integers(0, 1000), max_size=20),
    factor=st.integers(1, 8),
    data=st.data(),
)
def test_expand_matches_definition(ids: list[int], factor: int, data: st.DataObject) -> None:
    skip = data.draw(st.integers(0, factor - 1)) if ids else 0
    want = [b * factor + k for b in ids for k in range(factor)][skip:]
    assert expand_block_ids(ids, factor, skip).tolist() == want


@given(st.lists(st.integers(0, 50), max_size=30))
def test_runs_cover_rows_in_order(rows: list[int]) -> None:
    arr = np.asarray(rows, dtype=np.int64)
    runs = RowPlan.pairing(arr, arr).cpu_runs
    rebuilt = [first + k for _, first, length in runs for k in range(length)]
    assert rebuilt == rows
    assert [s for s, _, _ in runs] == list(np.cumsum([0] + [n for *_, n in runs])[:-1])
    for (_, a, n), (_, b, _) in itertools.pairwise(runs):
        assert b != a + n  # maximal


def _plan(gpu: tuple[int, ...], cpu: tuple[int, ...], skip: int = 0, gpu_is_dst: bool = False):
    return plan_rows(
        GPULoadStoreSpec(gpu, skip_count=skip),
        CPULoadStoreSpec(cpu),
        block_size_factor=2,
        num_gpu_blocks=10,
        num_cpu_blocks=4,
        gpu_is_dst=gpu_is_dst,
    )


def test_plan_pairs_rows() -> None:
    plan = _plan((9, 8, 7), (3, 0), skip=1)
    assert plan.gpu_rows.tolist() == [9, 8, 7]
    assert plan.cpu_rows.tolist() == [7, 0, 1]
    assert plan.cpu_runs == ((0, 7, 1), (1, 0, 2))


@pytest.mark.parametrize(
    ("gpu", "cpu", "skip", "dst", "match"),
    [
        ((1, 2, 3), (0,), 0, False, "2 GPU blocks expected, got 3"),
        ((1,), (0,), 0, False, "2 GPU blocks expected, got 1"),
        ((1, 10), (0,), 0, False, "GPU block id 10 out of range"),
        ((-1, 2), (0,), 0, False, "GPU block id -1 out of range"),
        ((1, 2), (-3,), 0, False, "CPU block id -3 out of range"),
        ((1, 2), (4,), 0, False, "CPU block id 4 out of range"),
        ((1, 2, 3, 4), (1, 1), 0, False, "destination CPU blocks repeat"),
        ((1, 1), (1,), 0, True, "destination GPU blocks repeat"),
    ],
)
def test_plan_rejects(gpu, cpu, skip, dst, match) -> None:
    with pytest.raises(ProtocolError, match=match):
        _plan(gpu, cpu, skip, gpu_is_dst=dst)


def test_plan_allows_repeated_source_gpu_blocks() -> None:
    assert _plan((1, 1), (0,)).gpu_rows.tolist() == [1, 1]


@given(st.lists(st.integers(0, 40), max_size=30))
def test_run_starts_where_rows_stop_being_consecutive(rows: list[int]) -> None:
    arr = np.asarray(rows, dtype=np.int64)
    plan = RowPlan.pairing(arr[::-1].copy(), arr)
    want = [i for i in range(len(rows)) if i == 0 or rows[i] != rows[i - 1] + 1]
    assert plan.run_starts.tolist() == want
    assert plan.run_starts.dtype == np.int64
    assert plan.num_runs == len(want)
    assert len(plan) == len(rows)


@given(st.lists(st.integers(-5, 20), max_size=25))
def test_repeats_is_a_duplicate_check(ids: list[int]) -> None:
    assert repeats(np.asarray(ids, dtype=np.int64)) == (len(set(ids)) != len(ids))
