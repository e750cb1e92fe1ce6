"""The OffloadingHandler contract, run against every handler.

Every job is reported exactly once, in submission order; refused jobs are reported
failed; nothing a job does raises out of get_finished or wait; shutdown finishes
queued jobs and refuses later ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

from kvtier.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout, OffloadingHandler, TransferResult
from kvtier.worker.handler import TransferSpec

from .conftest import GPU_BLOCK_SIZE, make_kv


@dataclass
class Case:
    handler: OffloadingHandler
    valid: Callable[[int], TransferSpec]
    invalid: TransferSpec


def _store(i: int) -> TransferSpec:
    return (GPULoadStoreSpec((i % 8, (i + 3) % 8)), CPULoadStoreSpec((i % 4,)))


def _load(i: int) -> TransferSpec:
    return (CPULoadStoreSpec((i % 4,)), GPULoadStoreSpec((i % 8, (i + 3) % 8)))


@pytest.fixture(params=["gpu_to_cpu", "cpu_to_gpu"])
def case(request) -> Iterator[Case]:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, 8)
    handlers = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, 2 * GPU_BLOCK_SIZE, 4)
    if request.param == "gpu_to_cpu":
        yield Case(
            handlers.gpu_to_cpu_handler, _store, (GPULoadStoreSpec((0,)), CPULoadStoreSpec((0,)))
        )
    else:
        yield Case(
            handlers.cpu_to_gpu_handler, _load, (CPULoadStoreSpec((9,)), GPULoadStoreSpec((0, 1)))
        )
    handlers.shutdown()


def drain(handler: OffloadingHandler, expected: int) -> list[TransferResult]:
    out: list[TransferResult] = []
    while len(out) < expected:
        out += handler.get_finished()
    assert handler.get_finished() == []
    return out


def test_is_a_handler(case: Case) -> None:
    assert isinstance(case.handler, OffloadingHandler)


def test_accepts_and_reports_once(case: Case) -> None:
    assert case.handler.transfer_async(1, case.valid(1)) is True
    case.handler.wait([1])
    (result,) = case.handler.get_finished()
    assert result == TransferResult(1, True, result.bytes_moved, result.seconds)
    assert result.bytes_moved > 0 and result.seconds >= 0.0
    assert case.handler.get_finished() == []


def test_refused_job_is_reported_failed(case: Case) -> None:
    assert case.handler.transfer_async(7, case.invalid) is False
    (result,) = drain(case.handler, 1)
    assert (result.job_id, result.success, result.bytes_moved) == (7, False, 0)
    assert result.error


def test_submission_order_with_mixed_jobs(case: Case) -> None:
    ids = list(range(100, 160))
    for i in ids:
        case.handler.transfer_async(i, case.invalid if i % 5 == 0 else case.valid(i))
    results = drain(case.handler, len(ids))
    assert [r.job_id for r in results] == ids
    assert all(r.success == (r.job_id % 5 != 0) for r in results)


def test_wait_on_unknown_or_reported_ids_returns(case: Case) -> None:
    """``wait`` returns at once for ids it never saw or already reported (a hang fails
    by the per-test timeout); it neither reports nor loses a job."""
    case.handler.wait([12345])
    assert case.handler.get_finished() == []
    assert case.handler.transfer_async(1, case.valid(1)) is True
    case.handler.wait([1])
    assert [(r.job_id, r.success) for r in case.handler.get_finished()] == [(1, True)]
    case.handler.wait([1])
    assert case.handler.get_finished() == []


def test_get_finished_does_not_block_or_raise_when_idle(case: Case) -> None:
    assert case.handler.get_finished() == []


def test_shutdown_finishes_queued_then_refuses(case: Case) -> None:
    for i in range(10):
        case.handler.transfer_async(i, case.valid(i))
    case.handler.shutdown()
    case.handler.shutdown()  # idempotent
    assert case.handler.transfer_async(10, case.valid(10)) is False
    results = drain(case.handler, 11)
    assert [r.success for r in results] == [True] * 10 + [False]
    assert "shut down" in (results[-1].error or "")
