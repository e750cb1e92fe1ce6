"""expand_block_ids, runs and job validation (pure index arithmetic)."""

from __future__ import annotations

import contextlib
import itertools
import re
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ProtocolError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.worker import blockmap
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


# plan_rows checks small jobs on Python lists and larger ones with numpy
# (SMALL_JOB_ROWS): both against a reference written from the definition.


def _reference_plan(
    gpu: list[int], cpu: list[int], f: int, skip: int, n_gpu: int, n_cpu: int, gpu_is_dst: bool
) -> tuple[list[int], list[int], list[int]] | str:
    """(gpu rows, cpu rows, run starts), or the error message plan_rows must raise."""
    if len(gpu) != len(cpu) * f - skip:
        return f"{len(cpu) * f - skip} GPU blocks expected, got {len(gpu)}"
    for name, ids, limit in (("GPU", gpu, n_gpu), ("CPU", cpu, n_cpu)):
        for b in ids:
            if not 0 <= b < limit:
                return f"{name} block id {b} out of range 0..{limit - 1}"
    rows = [b * f + k for b in cpu for k in range(f)][skip:]
    dst_name, dst = ("GPU", gpu) if gpu_is_dst else ("CPU", rows)
    if len(set(dst)) != len(dst):
        return f"destination {dst_name} blocks repeat in one job: {dst}"
    starts = [i for i in range(len(rows)) if i == 0 or rows[i] != rows[i - 1] + 1]
    return gpu, rows, starts


@st.composite
def _jobs(draw: st.DrawFn) -> tuple[list[int], list[int], int, int, int, int, bool]:
    f = draw(st.integers(1, 4))
    m = draw(st.integers(0, (2 * blockmap.SMALL_JOB_ROWS) // f + 2))
    skip = draw(st.integers(0, f - 1)) if m else 0
    n_gpu, n_cpu = draw(st.integers(1, 300)), draw(st.integers(1, 80))
    rows = max(0, m * f - skip + draw(st.sampled_from([0, 0, 0, 0, -1, 1])))
    if draw(st.booleans()):  # distinct, in range: a plan, or one planted fault
        cpu = draw(st.permutations(range(max(n_cpu, m))))[:m]
        gpu = draw(st.permutations(range(max(n_gpu, rows))))[:rows]
        if gpu and draw(st.booleans()):
            gpu[draw(st.integers(0, len(gpu) - 1))] = draw(st.sampled_from([-1, n_gpu, gpu[0]]))
    else:  # anything: repeats and out-of-range ids in both lists
        cpu = draw(st.lists(st.integers(-2, n_cpu + 1), min_size=m, max_size=m))
        gpu = draw(st.lists(st.integers(-2, n_gpu + 1), min_size=rows, max_size=rows))
    return gpu, cpu, f, skip, n_gpu, n_cpu, draw(st.booleans())


@pytest.mark.parametrize("threshold", ["default", 0, 10**9])
@given(job=_jobs())
def test_plan_matches_reference_on_both_paths(threshold, job) -> None:
    gpu, cpu, f, skip, n_gpu, n_cpu, gpu_is_dst = job
    want = _reference_plan(gpu, cpu, f, skip, n_gpu, n_cpu, gpu_is_dst)
    size = blockmap.SMALL_JOB_ROWS if threshold == "default" else threshold
    with mock.patch.object(blockmap, "SMALL_JOB_ROWS", size):
        try:
            plan = plan_rows(
                GPULoadStoreSpec(tuple(gpu), skip_count=skip),
                CPULoadStoreSpec(tuple(cpu)),
                block_size_factor=f,
                num_gpu_blocks=n_gpu,
                num_cpu_blocks=n_cpu,
                gpu_is_dst=gpu_is_dst,
            )
        except ProtocolError as exc:
            assert isinstance(want, str), f"raised {exc}, want {want}"
            assert want in str(exc)
            return
    assert not isinstance(want, str), f"planned, want error {want}"
    assert (plan.gpu_rows.tolist(), plan.cpu_rows.tolist(), plan.run_starts.tolist()) == want
    for arr in (plan.gpu_rows, plan.cpu_rows, plan.run_starts):
        assert arr.dtype == np.int64 and arr.ndim == 1


@pytest.mark.parametrize("offset", [-30, -1, 0, 1, 64])
@pytest.mark.parametrize("fault", [None, "gpu_high", "gpu_negative", "cpu_high", "repeat"])
@pytest.mark.parametrize("gpu_is_dst", [False, True])
def test_plan_around_the_threshold(offset: int, fault: str | None, gpu_is_dst: bool) -> None:
    """Jobs of up to SMALL_JOB_ROWS GPU blocks take the list path, larger ones numpy;
    both give the same rows and refuse the same faults with the same messages."""
    n = max(2, blockmap.SMALL_JOB_ROWS + offset)
    gpu, cpu = list(range(2 * n - 1, 0, -2)), list(range(n))  # one run on the host
    want = {
        None: None,
        "gpu_high": f"GPU block id {2 * n} out of range 0..{2 * n - 1}",
        "gpu_negative": f"GPU block id -1 out of range 0..{2 * n - 1}",
        "cpu_high": f"CPU block id {n} out of range 0..{n - 1}",
        "repeat": "blocks repeat in one job",
    }[fault]
    last = n - 1
    if fault == "gpu_high":
        gpu[last] = 2 * n
    elif fault == "gpu_negative":
        gpu[last] = -1
    elif fault == "cpu_high":
        cpu[last] = n
    elif fault == "repeat":
        gpu[last], cpu[last] = gpu[0], cpu[0]
    small = mock.patch.object(blockmap, "_plan_small", wraps=blockmap._plan_small)
    with small as spy, contextlib.ExitStack() as stack:
        if fault is not None:
            stack.enter_context(pytest.raises(ProtocolError, match=re.escape(want)))
        plan = plan_rows(
            GPULoadStoreSpec(tuple(gpu)),
            CPULoadStoreSpec(tuple(cpu)),
            block_size_factor=1,
            num_gpu_blocks=2 * n,
            num_cpu_blocks=n,
            gpu_is_dst=gpu_is_dst,
        )
    assert spy.called == (n <= blockmap.SMALL_JOB_ROWS)
    if fault is None:
        assert plan.gpu_rows.tolist() == gpu
        assert plan.cpu_rows.tolist() == cpu
        assert plan.run_starts.tolist() == [0]


@pytest.mark.parametrize("threshold", [0, 10**9])
@pytest.mark.parametrize(
    ("factor", "skip", "cpu", "match"), [(1, 1, 3, "skip_count"), (0, 0, 2, "factor")]
)
def test_plan_rejects_bad_factor_or_skip_on_both_paths(threshold, factor, skip, cpu, match) -> None:
    gpu = tuple(range(cpu * factor - skip))
    with (
        mock.patch.object(blockmap, "SMALL_JOB_ROWS", threshold),
        pytest.raises(ProtocolError, match=match),
    ):
        plan_rows(
            GPULoadStoreSpec(gpu, skip_count=skip),
            CPULoadStoreSpec(tuple(range(cpu))),
            block_size_factor=factor,
            num_gpu_blocks=10,
            num_cpu_blocks=10,
            gpu_is_dst=False,
        )
