"""GPU<->CPU handlers: byte-exact round trips, untouched neighbours, order, failures.

On this machine the "GPU" tensors are CPU tensors and each handler runs a worker
thread; the ``cuda`` cases repeat the round trips on a GPU when one is present.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout, TransferResult, pagecopy, rowcopy

from .conftest import DEVICES, DTYPES, GPU_BLOCK_SIZE, LAYOUTS, all_pages, make_kv, require_native

NUM_GPU_BLOCKS, NUM_CPU_BLOCKS = 16, 6


def run_job(handler, job_id: int, spec) -> TransferResult:
    assert handler.transfer_async(job_id, spec)
    handler.wait([job_id])
    (result,) = handler.get_finished()
    assert result.job_id == job_id
    return result


def sub_blocks(handlers: CpuGpuOffloadingHandlers) -> np.ndarray:
    """The slab as ``(num_cpu_blocks * f, page_bytes)`` (a copy)."""
    page = handlers.kv_view.page_bytes
    return handlers.host_slab.tensor.view(-1, page).cpu().numpy().copy()


COPY_PATHS = [
    "native",
    "native-streaming",
    "runs",
    "runs-1-row-chunks",
    "staged",
    "staged-1-row-chunks",
    "by-row",
]


def force_copy_path(mp: pytest.MonkeyPatch, path: str) -> None:
    """Make every job take one copy strategy (set before the handlers are built).

    ``native``: the host copier's compiled row copier (the default where a C compiler
    is), with ordinary stores; ``native-streaming``: the same with non-temporal stores.
    The others are for the CUDA copier and the host copier's numpy fallback
    (``KVTIER_NATIVE_COPY=0``): run by run, or staged (scattered rows: through a bounce
    buffer on CUDA, chunk by chunk on the host). One-row chunks make the host copier
    split every run and every job into many calls. ``by-row``: the host copier copies
    row by row, as it does for large fragments (the CUDA copier has no such path).
    """
    if path.startswith("native"):
        require_native()
        mp.setattr(rowcopy, "STREAM_MIN_BYTES", 0 if path.endswith("streaming") else 1 << 60)
        return
    mp.setenv(rowcopy.SWITCH_ENV, "0")
    staged = path.startswith("staged")
    mp.setattr(pagecopy, "RUN_MIN_BYTES", 1 << 60 if staged else 0)
    mp.setattr(pagecopy, "MAX_DIRECT_RUNS", 0 if staged else 1 << 60)
    mp.setattr(pagecopy, "ROW_COPY_MIN_BYTES", 0 if path == "by-row" else 1 << 60)
    if path.endswith("1-row-chunks"):
        mp.setattr(pagecopy, "CHUNK_BYTES", 1)


@pytest.fixture(params=COPY_PATHS)
def copy_path(request, monkeypatch) -> str:
    """Run each case through every copy strategy."""
    force_copy_path(monkeypatch, request.param)
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("factor", "skip"),
    [(1, 0), (2, 0), (2, 1), (4, 0), (4, 3)],
    ids=["f1", "f2-aligned", "f2-skip1", "f4-aligned", "f4-skip3"],
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_round_trip_byte_exact(layout, factor, skip, dtype, device, copy_path) -> None:
    kv = make_kv(layout, dtype, NUM_GPU_BLOCKS, seed=factor, device=device)
    h = CpuGpuOffloadingHandlers(
        kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE * factor, NUM_CPU_BLOCKS, layout
    )
    h.host_slab.tensor.copy_(torch.randint(0, 256, h.host_slab.tensor.shape, dtype=torch.uint8))
    gpu_before, slab_before = all_pages(kv, layout), sub_blocks(h)
    if device == "cpu":  # the host copier took the path asked for
        kind = "native" if copy_path.startswith("native") else "numpy"
        assert h.gpu_to_cpu_handler._copier.kind == h.cpu_to_gpu_handler._copier.kind == kind

    cpu_ids = (4, 1, 2)  # two runs of offloaded blocks, out of order
    n = len(cpu_ids) * factor - skip
    rng = np.random.default_rng(factor)
    src_gpu = tuple(int(b) for b in rng.permutation(NUM_GPU_BLOCKS)[:n])
    result = run_job(
        h.gpu_to_cpu_handler, 1, (GPULoadStoreSpec(src_gpu, skip), CPULoadStoreSpec(cpu_ids))
    )
    page = h.kv_view.page_bytes
    assert result.success and result.bytes_moved == n * page and result.error is None

    rows = [c * factor + k for c in cpu_ids for k in range(factor)][skip:]
    slab_after = sub_blocks(h)
    np.testing.assert_array_equal(slab_after[rows], gpu_before[list(src_gpu)])
    untouched = np.setdiff1d(np.arange(len(slab_after)), rows)
    np.testing.assert_array_equal(slab_after[untouched], slab_before[untouched])
    np.testing.assert_array_equal(all_pages(kv, layout), gpu_before)  # a store reads only

    dst_gpu = tuple(int(b) for b in rng.permutation(NUM_GPU_BLOCKS)[:n])
    result = run_job(
        h.cpu_to_gpu_handler, 2, (CPULoadStoreSpec(cpu_ids), GPULoadStoreSpec(dst_gpu, skip))
    )
    assert result.success and result.bytes_moved == n * page
    gpu_after = all_pages(kv, layout)
    np.testing.assert_array_equal(gpu_after[list(dst_gpu)], gpu_before[list(src_gpu)])
    others = np.setdiff1d(np.arange(NUM_GPU_BLOCKS), dst_gpu)
    np.testing.assert_array_equal(gpu_after[others], gpu_before[others])
    np.testing.assert_array_equal(sub_blocks(h), slab_after)  # a load reads only
    h.shutdown()


def test_nan_bit_patterns_survive(copy_path) -> None:
    """Words are copied as bits: signalling NaNs of every width come back unchanged."""
    kv = make_kv(KVLayout.BLOCKS_FIRST, torch.uint8, 4)
    patterns = torch.tensor(
        [0x7FF0000000000001, 0x7FF4000000000000, -0x0000000000000001, 0x7F800001FFC00001],
        dtype=torch.int64,
    )
    for t in kv:
        t.view(-1).view(torch.int64).copy_(patterns.repeat(t.numel() // 32))
    before = all_pages(kv, KVLayout.BLOCKS_FIRST)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, 4, "blocks_first")
    assert run_job(
        h.gpu_to_cpu_handler, 1, (GPULoadStoreSpec((0, 1, 2)), CPULoadStoreSpec((3, 0, 2)))
    ).success
    for t in kv:
        t.zero_()
    assert run_job(
        h.cpu_to_gpu_handler, 2, (CPULoadStoreSpec((3, 0, 2)), GPULoadStoreSpec((0, 1, 2)))
    ).success
    np.testing.assert_array_equal(all_pages(kv, KVLayout.BLOCKS_FIRST)[:3], before[:3])
    h.shutdown()


def test_fifo_under_many_queued_jobs() -> None:
    """200 queued stores to the same block: reported in order, and the last one wins."""
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, NUM_GPU_BLOCKS)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, 2 * GPU_BLOCK_SIZE, NUM_CPU_BLOCKS)
    handler = h.gpu_to_cpu_handler
    submitted = []
    for job in range(200):
        gpu = (job % NUM_GPU_BLOCKS, (job + 1) % NUM_GPU_BLOCKS)
        cpu = (0,) if job % 7 else (NUM_CPU_BLOCKS,)  # every 7th job is invalid
        handler.transfer_async(job, (GPULoadStoreSpec(gpu), CPULoadStoreSpec(cpu)))
        submitted.append(job)
    handler.wait(submitted)
    results: list[TransferResult] = []
    while len(results) < len(submitted):
        results += handler.get_finished()
    assert [r.job_id for r in results] == submitted
    assert [r.success for r in results] == [bool(j % 7) for j in submitted]
    last = all_pages(kv, KVLayout.KV_FIRST)[[199 % 16, 200 % 16]]
    np.testing.assert_array_equal(sub_blocks(h)[:2], last)
    h.shutdown()


def test_copy_that_raises_is_a_failed_job(monkeypatch) -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, NUM_GPU_BLOCKS)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, NUM_CPU_BLOCKS)
    handler = h.cpu_to_gpu_handler
    real_copy = handler._copier.copy
    calls = []

    def flaky(plan, gpu_to_cpu):
        calls.append(plan)
        if len(calls) == 2:
            raise RuntimeError("injected DMA fault")
        return real_copy(plan, gpu_to_cpu)

    monkeypatch.setattr(handler._copier, "copy", flaky)
    for job in range(3):
        assert handler.transfer_async(job, (CPULoadStoreSpec((job,)), GPULoadStoreSpec((job,))))
    handler.wait(range(3))
    results = handler.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(0, True), (1, False), (2, True)]
    assert results[1].error == "RuntimeError: injected DMA fault"
    assert results[1].bytes_moved == 0
    h.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gpu_to_cpu", [True, False], ids=["store", "load"])
def test_transfer_async_never_runs_the_copy_in_the_caller(gpu_to_cpu, monkeypatch) -> None:
    """The worker protocol: ``transfer_async`` never blocks on the copy. A one-block job
    submitted to an idle handler is copied by the lane's thread; nobody calls ``wait``
    (a caller blocked there may run queued jobs itself), results are polled."""
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, NUM_GPU_BLOCKS)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, NUM_CPU_BLOCKS)
    handler = h.gpu_to_cpu_handler if gpu_to_cpu else h.cpu_to_gpu_handler
    real_copy, ran_by, done = handler._copier.copy, [], threading.Event()

    def recording(plan, direction):
        ran_by.append(threading.get_ident())
        try:
            return real_copy(plan, direction)
        finally:
            done.set()

    monkeypatch.setattr(handler._copier, "copy", recording)
    gpu, cpu = GPULoadStoreSpec((3,)), CPULoadStoreSpec((1,))
    assert handler.transfer_async(1, (gpu, cpu) if gpu_to_cpu else (cpu, gpu)) is True
    assert done.wait(60)
    results: list[TransferResult] = []
    deadline = time.monotonic() + 60
    while not results and time.monotonic() < deadline:
        results = handler.get_finished()
        time.sleep(0.001)
    assert [(r.job_id, r.success) for r in results] == [(1, True)]
    assert len(ran_by) == 1 and ran_by[0] != threading.get_ident()
    h.shutdown()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ((GPULoadStoreSpec((0,)), GPULoadStoreSpec((1,))), "needs"),
        ((GPULoadStoreSpec((0, 1, 2)), CPULoadStoreSpec((0,))), "expected"),
        ((GPULoadStoreSpec((99,)), CPULoadStoreSpec((0,))), "out of range"),
        ((GPULoadStoreSpec((2**63,)), CPULoadStoreSpec((0,))), "too large"),  # past int64
        ((GPULoadStoreSpec((0,), skip_count=1), CPULoadStoreSpec((0,))), "skip_count"),
        ("not a spec", "invalid"),
    ],
)
def test_invalid_spec_is_refused_and_reported(spec, match) -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, NUM_GPU_BLOCKS)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, NUM_CPU_BLOCKS)
    assert h.gpu_to_cpu_handler.transfer_async(5, spec) is False
    h.gpu_to_cpu_handler.wait([5])
    (result,) = h.gpu_to_cpu_handler.get_finished()
    assert result.job_id == 5 and not result.success
    assert match in (result.error or "")
    h.shutdown()


def test_empty_job_succeeds() -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, NUM_GPU_BLOCKS)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, NUM_CPU_BLOCKS)
    result = run_job(h.gpu_to_cpu_handler, 1, (GPULoadStoreSpec(()), CPULoadStoreSpec(())))
    assert result.success and result.bytes_moved == 0
    h.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"gpu_block_size": 0}, "gpu_block_size"),
        ({"cpu_block_size": 6}, "cpu_block_size"),
        ({"num_cpu_blocks": 0}, "num_cpu_blocks"),
        ({"layout": "blocks_first"}, "gpu_kv_caches"),
    ],
)
def test_bad_construction_raises_config_error(kwargs, key) -> None:
    args = {"gpu_block_size": 4, "cpu_block_size": 8, "num_cpu_blocks": 2, "layout": "kv_first"}
    args.update(kwargs)
    with pytest.raises(ConfigError) as info:
        CpuGpuOffloadingHandlers(make_kv(KVLayout.KV_FIRST, torch.float16, 4), **args)
    assert info.value.key == key


def test_slab_is_exact_and_unpinned_without_cuda() -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.bfloat16, 8)
    h = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, 4 * GPU_BLOCK_SIZE, 3)
    assert h.host_slab.nbytes == 3 * 4 * h.kv_view.page_bytes
    assert h.host_slab.pinned is False  # CPU tensors: plain host memory
    h.shutdown()


@pytest.mark.parametrize("path", COPY_PATHS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), factor=st.sampled_from([1, 2, 4]), layout=st.sampled_from(LAYOUTS))
def test_random_job_sequences_match_a_byte_model(path, data, factor, layout) -> None:
    """Any sequence of valid stores and loads leaves exactly the bytes a dict model predicts."""
    with pytest.MonkeyPatch.context() as mp:
        force_copy_path(mp, path)
        _random_job_sequence(data, factor, layout)


def _random_job_sequence(data, factor, layout) -> None:
    kv = make_kv(layout, torch.float16, NUM_GPU_BLOCKS, seed=factor)
    h = CpuGpuOffloadingHandlers(
        kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE * factor, NUM_CPU_BLOCKS, layout
    )
    h.host_slab.tensor.zero_()
    gpu, slab = all_pages(kv, layout), sub_blocks(h)
    for job in range(data.draw(st.integers(1, 6), label="jobs")):
        cpu_ids = data.draw(
            st.lists(st.integers(0, NUM_CPU_BLOCKS - 1), min_size=1, max_size=3, unique=True)
        )
        skip = data.draw(st.integers(0, factor - 1))
        n = len(cpu_ids) * factor - skip
        store = data.draw(st.booleans())
        gpu_ids = data.draw(st.permutations(range(NUM_GPU_BLOCKS)))[:n]
        rows = [c * factor + k for c in cpu_ids for k in range(factor)][skip:]
        gspec, cspec = GPULoadStoreSpec(tuple(gpu_ids), skip), CPULoadStoreSpec(tuple(cpu_ids))
        if store:
            assert run_job(h.gpu_to_cpu_handler, job, (gspec, cspec)).success
            slab[rows] = gpu[gpu_ids]
        else:
            assert run_job(h.cpu_to_gpu_handler, job, (cspec, gspec)).success
            gpu[gpu_ids] = slab[rows]
        np.testing.assert_array_equal(all_pages(kv, layout), gpu)
        np.testing.assert_array_equal(sub_blocks(h), slab)
    h.shutdown()
