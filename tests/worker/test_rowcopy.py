"""The compiled row copier: exact bytes, bounds checked before C, loading and fallbacks.

The oracle is a copy made row by row with torch slicing (``reference``), which shares
nothing with either copier; every case also runs through the numpy fallback.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import TransferSpecError
from kvtier.worker import rowcopy
from kvtier.worker.blockmap import RowPlan
from kvtier.worker.pagecopy import HostPageCopier, SlabRows

from .conftest import require_native

KIB = 1024
WIDTHS = [
    [1],
    [3, 5],
    [64],
    [17, 100, 1000],
    [8 * KIB] * 4,
    [16 * KIB, 16 * KIB],
    [64 * KIB],
    [256 * KIB],
    # Two groups of fragments streamed together (rowcopy.c's WAYS = 4), the second
    # partial; bodies of unequal lengths, unaligned heads, tails under 64 bytes.
    [8 * KIB + 40, 3, 200, 64, 1000, 8 * KIB],
]
PATHS = ["native", "native-streaming", "numpy"]


def host_copier(
    mp: pytest.MonkeyPatch, path: str, frags: list[torch.Tensor], slab: torch.Tensor
) -> HostPageCopier:
    if path.startswith("native"):
        require_native()
        mp.setattr(rowcopy, "STREAM_MIN_BYTES", 0 if path.endswith("streaming") else 1 << 60)
    else:
        mp.setenv(rowcopy.SWITCH_ENV, "0")
    copier = HostPageCopier(frags, slab)
    assert copier.kind == ("numpy" if path == "numpy" else "native")
    return copier


def random_tensors(
    widths: list[int], gpu_blocks: int, cpu_blocks: int, seed: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    frags = [
        torch.randint(0, 256, (gpu_blocks, w), dtype=torch.uint8, generator=gen) for w in widths
    ]
    slab = torch.randint(0, 256, (cpu_blocks, sum(widths)), dtype=torch.uint8, generator=gen)
    return frags, slab


def reference(
    frags: list[torch.Tensor], slab: torch.Tensor, plan: RowPlan, gpu_to_cpu: bool
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The expected fragments and slab after the job: one torch row copy at a time."""
    frags, slab = [f.clone() for f in frags], slab.clone()
    for g, c in zip(plan.gpu_rows.tolist(), plan.cpu_rows.tolist(), strict=True):
        offset = 0
        for f in frags:
            width = f.shape[1]
            if gpu_to_cpu:
                slab[c, offset : offset + width] = f[g]
            else:
                f[g] = slab[c, offset : offset + width]
            offset += width
    return frags, slab


def rows(rng: np.random.Generator, ids: str, n: int, limit: int) -> np.ndarray:
    if ids == "contiguous":
        first = int(rng.integers(0, limit - n + 1))
        return np.arange(first, first + n, dtype=np.int64)
    return rng.permutation(limit)[:n].astype(np.int64)


def check_job(copier: HostPageCopier, frags, slab, plan: RowPlan, gpu_to_cpu: bool) -> None:
    want_frags, want_slab = reference(frags, slab, plan, gpu_to_cpu)
    nbytes, keep = copier.copy(plan, gpu_to_cpu)
    assert (nbytes, keep) == (len(plan) * slab.shape[1], None)
    assert torch.equal(slab, want_slab)
    assert all(torch.equal(f, w) for f, w in zip(frags, want_frags, strict=True))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "-".join(map(str, w)))
@pytest.mark.parametrize(
    ("gpu_ids", "cpu_ids"),
    [("random", "random"), ("random", "contiguous"), ("contiguous", "contiguous")],
)
@pytest.mark.parametrize("gpu_to_cpu", [True, False], ids=["store", "load"])
def test_jobs_match_a_row_by_row_reference(
    monkeypatch, path, widths, gpu_ids, cpu_ids, gpu_to_cpu
) -> None:
    frags, slab = random_tensors(widths, 12, 10, seed=sum(widths))
    copier = host_copier(monkeypatch, path, frags, slab)
    rng = np.random.default_rng(len(widths))
    for n in (1, 2, 7):
        plan = RowPlan.pairing(rows(rng, gpu_ids, n, 12), rows(rng, cpu_ids, n, 10))
        check_job(copier, frags, slab, plan, gpu_to_cpu)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_plans_match_a_row_by_row_reference(path, data) -> None:
    widths = data.draw(
        st.lists(
            st.one_of(st.integers(1, 300), st.sampled_from([4 * KIB, 8 * KIB, 64 * KIB])),
            min_size=1,
            max_size=4,
        ),
        label="widths",
    )
    gpu_blocks, cpu_blocks = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    n = data.draw(st.integers(0, min(gpu_blocks, cpu_blocks)))
    gpu_rows = data.draw(st.permutations(range(gpu_blocks)))[:n]
    cpu_rows = data.draw(st.permutations(range(cpu_blocks)))[:n]
    if data.draw(st.booleans(), label="sorted host rows"):
        cpu_rows = sorted(cpu_rows)
    frags, slab = random_tensors(widths, gpu_blocks, cpu_blocks, seed=n)
    with pytest.MonkeyPatch.context() as mp:
        copier = host_copier(mp, path, frags, slab)
        plan = RowPlan.pairing(np.array(gpu_rows, np.int64), np.array(cpu_rows, np.int64))
        check_job(copier, frags, slab, plan, data.draw(st.booleans(), label="store"))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("gpu_rows", "cpu_rows", "match"),
    [
        ([0, 12], [1, 2], r"GPU row 12 out of range 0\.\.11"),
        ([0, -1], [1, 2], "GPU row -1 out of range"),
        ([0, 1], [10, 2], r"host row 10 out of range 0\.\.9"),
        ([0, 1], [3, -5], "host row -5 out of range"),
    ],
)
def test_a_row_out_of_range_raises_before_anything_is_copied(
    monkeypatch, path, gpu_rows, cpu_rows, match
) -> None:
    frags, slab = random_tensors([8, 24], 12, 10, seed=1)
    copier = host_copier(monkeypatch, path, frags, slab)
    before = [f.clone() for f in frags], slab.clone()
    plan = RowPlan.pairing(np.array(gpu_rows, np.int64), np.array(cpu_rows, np.int64))
    for gpu_to_cpu in (True, False):
        with pytest.raises(TransferSpecError, match=match):
            copier.copy(plan, gpu_to_cpu)
    assert torch.equal(slab, before[1])
    assert all(torch.equal(f, b) for f, b in zip(frags, before[0], strict=True))


@pytest.mark.parametrize("path", ["native", "native-streaming"])
def test_jobs_of_every_size_through_one_route(monkeypatch, path) -> None:
    """A route copies through its own row buffers, grown for a larger job and reused
    for smaller ones (the rows past a smaller job's end are stale: never copied)."""
    frags, slab = random_tensors([3, 64, 8], 400, 300, seed=7)
    copier = host_copier(monkeypatch, path, frags, slab)
    rng = np.random.default_rng(7)
    for i, n in enumerate((1, 64, 65, 300, 2, 150, 64)):
        plan = RowPlan.pairing(rows(rng, "random", n, 400), rows(rng, "random", n, 300))
        check_job(copier, frags, slab, plan, gpu_to_cpu=i % 2 == 0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("side", "at"), [("GPU", 0), ("GPU", 199), ("host", 0), ("host", 299)])
def test_a_bad_row_late_in_a_long_job_is_named_and_nothing_is_copied(
    monkeypatch, path, side, at
) -> None:
    frags, slab = random_tensors([8, 24], 400, 300, seed=2)
    copier = host_copier(monkeypatch, path, frags, slab)
    before = [f.clone() for f in frags], slab.clone()
    rng = np.random.default_rng(2)
    gpu, cpu = rows(rng, "random", 300, 400), rows(rng, "random", 300, 300)
    bad = 400 + at if side == "GPU" else -3 - at
    (gpu if side == "GPU" else cpu)[at] = bad
    plan = RowPlan.pairing(gpu, cpu)
    limit = 399 if side == "GPU" else 299
    for gpu_to_cpu in (True, False):
        with pytest.raises(
            TransferSpecError, match=rf"{side} row {bad} out of range 0\.\.{limit}$"
        ):
            copier.copy(plan, gpu_to_cpu)
    assert torch.equal(slab, before[1])
    assert all(torch.equal(f, b) for f, b in zip(frags, before[0], strict=True))


def slab_rows(mp: pytest.MonkeyPatch, path: str, slab: torch.Tensor) -> SlabRows:
    if path.startswith("native"):
        require_native()
        mp.setattr(rowcopy, "STREAM_MIN_BYTES", 0 if path.endswith("streaming") else 1 << 60)
    else:
        mp.setenv(rowcopy.SWITCH_ENV, "0")
    rows_ = SlabRows(slab)
    assert rows_.kind == ("numpy" if path == "numpy" else "native")
    return rows_


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("page", [1, 200, 8 * KIB + 40])
@pytest.mark.parametrize("n", [0, 1, 5, 70])
def test_slab_rows_scatter_and_gather_whole_pages(monkeypatch, path, page, n) -> None:
    """The host side of the CUDA copier's bounce path, against torch row copies."""
    _, slab = random_tensors([page], 1, 90, seed=page + n)
    moved = slab_rows(monkeypatch, path, slab)
    rng = np.random.default_rng(n)
    cpu = rows(rng, "random", n, 90)
    buffer = torch.randint(0, 256, (n, page), dtype=torch.uint8)
    want = slab.clone()
    for i, c in enumerate(cpu.tolist()):
        want[c] = buffer[i]
    moved.scatter(buffer, cpu)
    assert torch.equal(slab, want)
    slab.copy_(torch.randint(0, 256, slab.shape, dtype=torch.uint8))
    out = torch.zeros((n, page), dtype=torch.uint8)
    moved.gather(cpu, out)
    assert torch.equal(out, slab[torch.from_numpy(cpu)] if n else out)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", [90, -1])
def test_slab_rows_refuse_a_row_past_the_slab_and_copy_nothing(monkeypatch, path, bad) -> None:
    _, slab = random_tensors([64], 1, 90, seed=5)
    moved = slab_rows(monkeypatch, path, slab)
    cpu = np.array([3, 7, bad], dtype=np.int64)
    buffer = torch.randint(0, 256, (3, 64), dtype=torch.uint8)
    before, buffer_before = slab.clone(), buffer.clone()
    with pytest.raises(TransferSpecError, match=rf"host row {bad} out of range 0\.\.89"):
        moved.scatter(buffer, cpu)
    with pytest.raises(TransferSpecError, match=rf"host row {bad} out of range 0\.\.89"):
        moved.gather(cpu, buffer)
    with pytest.raises(TransferSpecError, match="3 slab rows for a buffer of 2"):
        moved.scatter(buffer[:2], np.array([1, 2, 3], dtype=np.int64))
    assert torch.equal(slab, before) and torch.equal(buffer, buffer_before)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("width", [63, 65])
def test_slab_rows_refuse_a_buffer_of_another_page_width(monkeypatch, path, width) -> None:
    _, slab = random_tensors([64], 1, 90, seed=6)
    moved = slab_rows(monkeypatch, path, slab)
    cpu = np.array([3, 7], dtype=np.int64)
    buffer = torch.randint(0, 256, (2, width), dtype=torch.uint8)
    before, buffer_before = slab.clone(), buffer.clone()
    for move in (lambda: moved.scatter(buffer, cpu), lambda: moved.gather(cpu, buffer)):
        with pytest.raises(TransferSpecError, match=rf"buffer rows of shape \({width},\)"):
            move()
    assert torch.equal(slab, before) and torch.equal(buffer, buffer_before)


@pytest.mark.parametrize("path", PATHS)
def test_slab_rows_jobs_of_changing_sizes_through_one_route_each_way(monkeypatch, path) -> None:
    """Jobs of 5, 70, 1, 0 and 33 rows, scatter and gather alternating, each into its own
    buffer: exact bytes every time (a route left pointing at an earlier, larger buffer
    would copy from or into the wrong one), and one route per direction is built."""
    _, slab = random_tensors([200], 1, 90, seed=11)
    moved = slab_rows(monkeypatch, path, slab)
    built = []
    if moved._native is not None:
        real = moved._native.route
        monkeypatch.setattr(moved._native, "route", lambda *a: built.append(a) or real(*a))
    rng = np.random.default_rng(3)
    for n in (5, 70, 1, 0, 33):
        cpu = rows(rng, "random", n, 90)
        buffer = torch.randint(0, 256, (n, 200), dtype=torch.uint8)
        want = slab.clone()
        for i, c in enumerate(cpu.tolist()):
            want[c] = buffer[i]
        moved.scatter(buffer, cpu)
        assert torch.equal(slab, want)
        out = torch.zeros((n, 200), dtype=torch.uint8)
        moved.gather(cpu, out)
        assert torch.equal(out, slab[torch.from_numpy(cpu)] if n else out)
    assert len(built) == (2 if path != "numpy" else 0)


def test_slab_rows_routes_let_go_of_a_jobs_buffer_and_survive_a_bad_job(monkeypatch) -> None:
    """Between jobs the cached routes hold no job buffer (a freed pinned buffer must never
    be written through a stale pointer), also after a job refused for a bad row."""
    _, slab = random_tensors([64], 1, 20, seed=12)
    moved = slab_rows(monkeypatch, "native", slab)
    buffer = torch.randint(0, 256, (3, 64), dtype=torch.uint8)
    alive = weakref.ref(buffer)
    moved.scatter(buffer, np.array([1, 2, 3], dtype=np.int64))
    with pytest.raises(TransferSpecError, match=r"host row 20 out of range 0\.\.19"):
        moved.gather(np.array([4, 20, 5], dtype=np.int64), buffer)
    del buffer
    assert alive() is None
    out = torch.zeros((2, 64), dtype=torch.uint8)
    moved.gather(np.array([3, 1], dtype=np.int64), out)  # the route still works
    assert torch.equal(out, slab[[3, 1]])


def test_route_copies_through_another_tensor_for_one_call() -> None:
    native = require_native()
    src = [torch.arange(32, dtype=torch.uint8).view(4, 8), torch.ones((4, 2), dtype=torch.uint8)]
    own = [torch.zeros((4, 10), dtype=torch.uint8)]
    route = native.route([torch.cat(src, 1)], own, ("source", "buffer"))
    other = torch.zeros((2, 10), dtype=torch.uint8)
    route.copy(np.array([3, 0]), np.array([1, 0]), through=(1, other))
    assert torch.equal(other, torch.cat(src, 1)[[0, 3]])
    assert int(own[0].count_nonzero()) == 0  # the route's own side is left alone
    with pytest.raises(TransferSpecError, match=r"buffer row 2 out of range 0\.\.1"):
        route.copy(np.array([0]), np.array([2]), through=(1, other))  # the tensor's rows
    route.copy(np.array([2]), np.array([3]))  # back on its own side, with its own rows
    assert torch.equal(own[0][3], torch.cat(src, 1)[2]) and int(own[0][:3].count_nonzero()) == 0
    one = torch.full((1, 10), 7, dtype=torch.uint8)
    route.copy(np.array([0]), np.array([0]), through=(0, one))
    assert own[0][0].tolist() == [7] * 10
    with pytest.raises(TransferSpecError, match=r"source row 1 out of range 0\.\.0"):
        route.copy(np.array([1]), np.array([0]), through=(0, one))
    wide = torch.zeros((3, 20), dtype=torch.uint8)  # rows 20 bytes apart: the stride follows
    route.copy(np.array([0]), np.array([2]), through=(1, wide[:, 4:14]))
    assert wide[2].tolist() == [0] * 4 + list(range(8)) + [1, 1] + [0] * 6
    assert int(wide[:2].count_nonzero()) == 0
    with pytest.raises(ValueError, match="widths differ: 9 and 10"):
        route.copy(
            np.array([0]), np.array([0]), through=(1, torch.zeros((4, 9), dtype=torch.uint8))
        )
    with pytest.raises(ValueError, match="contiguous rows"):
        route.copy(
            np.array([0]), np.array([0]), through=(1, torch.zeros((10, 4), dtype=torch.uint8).t())
        )
    two = native.route(
        src, [torch.zeros((4, 8), dtype=torch.uint8), torch.zeros((4, 2), dtype=torch.uint8)]
    )
    with pytest.raises(ValueError, match="one fragment, not 2"):
        two.copy(np.array([0]), np.array([0]), through=(1, other))


def test_route_refuses_rows_of_two_lengths_and_bad_views() -> None:
    native = require_native()
    src = [torch.zeros((4, 8), dtype=torch.uint8)]
    dst = [torch.ones((4, 8), dtype=torch.uint8)]
    route = native.route(src, dst)
    with pytest.raises(TransferSpecError, match="row arrays differ"):
        route.copy(np.array([0, 1]), np.array([0]))
    with pytest.raises(TransferSpecError, match="row arrays differ"):
        route.copy(np.array(0), np.array(0))  # 0-d: not a list of rows
    with pytest.raises(TransferSpecError, match=r"source row 9223372036854775808 out of range"):
        route.copy(np.array([2**63], dtype=np.uint64), np.array([0]))
    with pytest.raises(TransferSpecError, match=r"source row 4 out of range 0\.\.3"):
        route.copy(np.array([4]), np.array([0]))
    assert torch.equal(dst[0], torch.ones((4, 8), dtype=torch.uint8))
    with pytest.raises(ValueError, match="widths differ"):
        native.route(src, [torch.zeros((4, 9), dtype=torch.uint8)])
    with pytest.raises(ValueError, match="contiguous rows"):
        native.route(src, [torch.zeros((8, 4), dtype=torch.uint8).t()])
    with pytest.raises(ValueError, match="uint8"):
        native.route(src, [torch.zeros((4, 2), dtype=torch.float32)])


def test_calls_release_the_gil() -> None:
    """The copier's function comes from ``ctypes.CDLL`` (the GIL is released during each
    call), not ``ctypes.PyDLL`` (which would hold it and serialise the lanes)."""
    native = require_native()
    assert not native.copy_rows._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_two_threads_copying_at_once_give_exact_bytes() -> None:
    require_native()
    widths = [8 * KIB] * 4
    jobs = []
    for seed in (1, 2):
        frags, slab = random_tensors(widths, 64, 64, seed=seed)
        copier = HostPageCopier(frags, slab)
        assert copier.kind == "native"
        rng = np.random.default_rng(seed)
        plans = [
            RowPlan.pairing(rng.permutation(64)[:48], rng.permutation(64)[:48]) for _ in range(20)
        ]
        jobs.append((copier, frags, slab, plans))
    # the expected end state, job after job, by the row-by-row reference
    want = []
    for _, frags, slab, plans in jobs:
        f, s = frags, slab
        for i, plan in enumerate(plans):
            f, s = reference(f, s, plan, gpu_to_cpu=i % 2 == 0)
        want.append((f, s))
    start = threading.Barrier(2)

    def run(copier, plans) -> None:
        start.wait()
        for i, plan in enumerate(plans):
            copier.copy(plan, i % 2 == 0)

    threads = [threading.Thread(target=run, args=(c, p)) for c, _, _, p in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (_, frags, slab, _), (want_frags, want_slab) in zip(jobs, want, strict=True):
        assert torch.equal(slab, want_slab)
        assert all(torch.equal(f, w) for f, w in zip(frags, want_frags, strict=True))


# --- loading and falling back ---------------------------------------------------------


def test_an_unbuilt_extension_falls_back_to_numpy_with_one_warning(monkeypatch, caplog) -> None:
    monkeypatch.setattr(rowcopy, "EXTENSION", "kvtier.worker._never_built")
    monkeypatch.delenv(rowcopy.SWITCH_ENV, raising=False)
    frags, slab = random_tensors([8, 24], 12, 10, seed=3)
    with caplog.at_level(logging.WARNING, logger="kvtier.worker.rowcopy"):
        copiers = [HostPageCopier(frags, slab) for _ in range(2)]
    assert [c.kind for c in copiers] == ["numpy", "numpy"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "kvtier.worker.rowcopy"]
    assert len(warnings) == 1, warnings
    assert "kvtier.worker._never_built is not built" in warnings[0]
    assert "installed without a C compiler" in warnings[0] and "use numpy" in warnings[0]
    plan = RowPlan.pairing(np.array([3, 0, 11]), np.array([9, 4, 5]))
    check_job(copiers[0], frags, slab, plan, True)
    check_job(copiers[0], frags, slab, plan, False)


def test_switch_off_means_numpy_without_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setenv(rowcopy.SWITCH_ENV, "0")
    frags, slab = random_tensors([8], 4, 4, seed=0)
    with caplog.at_level(logging.WARNING):
        assert HostPageCopier(frags, slab).kind == "numpy"
        assert rowcopy.native_row_copier() is None
    assert not caplog.records


def test_nothing_is_compiled_when_the_copier_loads(monkeypatch) -> None:
    """The library comes from the install; loading it starts no process (no compiler)."""
    require_native()

    def no_process(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(os, "posix_spawn", no_process, raising=False)
    monkeypatch.setattr(os, "fork", no_process)
    assert rowcopy.load_row_copier() is not None


def test_a_library_of_another_abi_is_refused(monkeypatch, caplog) -> None:
    require_native()
    monkeypatch.setattr(rowcopy, "ABI", rowcopy.ABI + 1)
    with caplog.at_level(logging.WARNING, logger="kvtier.worker.rowcopy"):
        assert rowcopy.load_row_copier() is None
    assert f"reports ABI {rowcopy.ABI - 1} where {rowcopy.ABI} is expected" in caplog.text


@pytest.mark.parametrize(("returns", "why"), [(-1, "copies nothing"), (0, "calls a good row bad")])
def test_the_self_test_refuses_a_library_that_copies_wrong(returns: int, why: str) -> None:
    """A library left from older source that loads but copies nothing, or reports a
    good row out of range, fails the self-test (and is then never used)."""
    native = require_native()
    assert rowcopy._self_test(native)
    broken = rowcopy.NativeRowCopier.__new__(rowcopy.NativeRowCopier)
    broken.path, broken.copy_rows = native.path, lambda *args: returns
    assert not rowcopy._self_test(broken), why


def test_the_extension_is_built_at_install_time() -> None:
    """``pyproject.toml`` declares the C loop as an optional extension of the package
    (a wheel built from this tree was checked to hold it; without a compiler the
    install succeeds without it)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    (ext,) = config["tool"]["setuptools"]["ext-modules"]
    assert ext["name"] == rowcopy.EXTENSION
    assert ext["sources"] == ["src/kvtier/worker/rowcopy.c"] and ext["optional"] is True
    assert (root / ext["sources"][0]).is_file()
