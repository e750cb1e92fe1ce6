"""OffloadingWorker: routing by medium pair, and failures that never escape."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from kvtier.blocks import Medium
from kvtier.errors import ProtocolError, TransferSpecError
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.worker import (
    CpuGpuOffloadingHandlers,
    KVLayout,
    OffloadingHandler,
    OffloadingWorker,
    TransferResult,
)
from kvtier.worker.blockmap import expand_block_ids
from kvtier.worker.handler import TransferSpec, spec_media
from kvtier.worker.thread_pool_handler import split_spec

from .conftest import GPU_BLOCK_SIZE, make_kv


class ScriptedHandler(OffloadingHandler):
    """Finishes jobs immediately, or raises / refuses as told."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.jobs: list[int] = []
        self._done: list[TransferResult] = []

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        if self.mode == "raise":
            raise RuntimeError("boom")
        self.jobs.append(job_id)
        ok = self.mode == "ok"
        self._done.append(TransferResult(job_id, ok, 1 if ok else 0, 0.0, None if ok else "no"))
        return ok

    def get_finished(self) -> list[TransferResult]:
        if self.mode == "raise-finished":
            raise RuntimeError("poll failed")
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        pass

    def shutdown(self) -> None:
        self.mode = "shut"


STORE = (GPULoadStoreSpec((0,)), CPULoadStoreSpec((0,)))
LOAD = (CPULoadStoreSpec((0,)), GPULoadStoreSpec((0,)))


def test_routes_by_medium_pair() -> None:
    worker, up, down = OffloadingWorker(), ScriptedHandler(), ScriptedHandler()
    worker.register_handler(Medium.GPU, Medium.CPU, up)
    worker.register_handler(Medium.CPU, Medium.GPU, down)
    assert worker.transfer_async(1, STORE) and worker.transfer_async(2, LOAD)
    assert (up.jobs, down.jobs) == ([1], [2])
    assert sorted(r.job_id for r in worker.get_finished()) == [1, 2]


def test_unknown_pair_is_a_failed_result() -> None:
    worker = OffloadingWorker()
    worker.register_handler(Medium.GPU, Medium.CPU, ScriptedHandler())
    assert worker.transfer_async(3, (CPULoadStoreSpec((0,)), DiskLoadStoreSpec((0,)))) is False
    (result,) = worker.get_finished()
    assert (result.job_id, result.success) == (3, False)
    assert "no handler for CPU->DISK" in (result.error or "")


def test_malformed_spec_is_a_failed_result() -> None:
    worker = OffloadingWorker()
    assert worker.transfer_async(4, ("x", "y")) is False  # type: ignore[arg-type]
    error = worker.get_finished()[0].error or ""
    assert error.startswith("invalid transfer spec: a transfer spec is (src spec, dst spec)")


@pytest.mark.parametrize(
    "check",
    [
        lambda: spec_media(("x", "y")),  # type: ignore[arg-type]
        lambda: GPULoadStoreSpec((0,), skip_count=-1),
        lambda: expand_block_ids([0], 2, skip_count=2),
        lambda: split_spec(
            (CPULoadStoreSpec((0,)), DiskLoadStoreSpec((0,), (b"k",))), False, DiskLoadStoreSpec, 4
        ),
        lambda: split_spec(
            (CPULoadStoreSpec((0, 1)), DiskLoadStoreSpec((0,), (b"k",))), True, DiskLoadStoreSpec, 4
        ),
    ],
    ids=["not-a-pair", "negative-skip", "skip-past-block", "wrong-direction", "count-mismatch"],
)
def test_every_malformed_spec_raises_one_error_type(check) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TransferSpecError):
        check()


@pytest.mark.parametrize("mode", ["raise", "refuse"])
def test_handler_that_raises_or_refuses_fails_only_its_job(mode: str) -> None:
    worker = OffloadingWorker()
    worker.register_handler(Medium.GPU, Medium.CPU, ScriptedHandler(mode))
    worker.register_handler(Medium.CPU, Medium.GPU, ScriptedHandler())
    assert worker.transfer_async(1, STORE) is False
    assert worker.transfer_async(2, LOAD) is True
    results = {r.job_id: r for r in worker.get_finished()}
    assert results[1].success is False and results[2].success is True
    assert worker.get_finished() == []


def test_handler_that_raises_in_get_finished_fails_its_pending_jobs() -> None:
    worker, broken = OffloadingWorker(), ScriptedHandler()
    worker.register_handler(Medium.GPU, Medium.CPU, broken)
    worker.transfer_async(1, STORE)
    broken.mode = "raise-finished"
    (result,) = worker.get_finished()
    assert result.job_id == 1 and not result.success and "poll failed" in (result.error or "")


def test_duplicate_in_flight_job_id_is_a_protocol_error() -> None:
    worker = OffloadingWorker()
    worker.register_handler(Medium.GPU, Medium.CPU, ScriptedHandler())
    worker.transfer_async(1, STORE)
    with pytest.raises(ProtocolError, match="job 1"):
        worker.transfer_async(1, STORE)
    worker.get_finished()
    assert worker.transfer_async(1, STORE)  # reported ids may be reused


def test_double_registration_is_a_protocol_error() -> None:
    worker = OffloadingWorker()
    worker.register_handler(Medium.GPU, Medium.CPU, ScriptedHandler())
    with pytest.raises(ProtocolError, match="already registered"):
        worker.register_handler(Medium.GPU, Medium.CPU, ScriptedHandler())


def test_with_real_handlers_store_then_load() -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, 8)
    before = [t.clone() for t in kv]
    handlers = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, GPU_BLOCK_SIZE, 4)
    worker = OffloadingWorker()
    worker.register_handler(Medium.GPU, Medium.CPU, handlers.gpu_to_cpu_handler)
    worker.register_handler(Medium.CPU, Medium.GPU, handlers.cpu_to_gpu_handler)
    assert worker.transfer_async(1, (GPULoadStoreSpec((5,)), CPULoadStoreSpec((2,))))
    worker.wait([1])
    assert [r.success for r in worker.get_finished()] == [True]
    assert worker.transfer_async(2, (CPULoadStoreSpec((2,)), GPULoadStoreSpec((0,))))
    worker.wait([2])
    assert [r.success for r in worker.get_finished()] == [True]
    bits = [(t.view(torch.int16), b.view(torch.int16)) for t, b in zip(kv, before, strict=True)]
    assert all(torch.equal(t[:, 0], b[:, 5]) for t, b in bits)  # bits: random bytes hold NaNs
    worker.shutdown()
    handlers.host_slab.close()
