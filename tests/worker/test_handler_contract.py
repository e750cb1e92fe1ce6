"""The OffloadingHandler contract, run against every handler pair.

GPU<->CPU, CPU<->disk (real files) and CPU<->remote (a real redis-server): every job
is reported exactly once, in submission order; refused jobs are reported failed;
nothing a job does raises out of get_finished or wait; shutdown finishes queued jobs
and refuses later ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import (
    CPULoadStoreSpec,
    DiskLoadStoreSpec,
    GPULoadStoreSpec,
    RemoteLoadStoreSpec,
)
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.media.remote import RemoteOptions, RemoteStore
from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout, OffloadingHandler, TransferResult
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers
from kvtier.worker.handler import TransferSpec

from ..redis_server import RedisServer
from .conftest import GPU_BLOCK_SIZE, make_kv

FP = b"\x77" * 32
ROWS, ROW_BYTES = 4, 8192


@dataclass
class Case:
    handler: OffloadingHandler
    valid: Callable[[int], TransferSpec]
    invalid: TransferSpec


def _store(i: int) -> TransferSpec:
    return (GPULoadStoreSpec((i % 8, (i + 3) % 8)), CPULoadStoreSpec((i % 4,)))


def _load(i: int) -> TransferSpec:
    return (CPULoadStoreSpec((i % 4,)), GPULoadStoreSpec((i % 8, (i + 3) % 8)))


def _key(i: int) -> BlockHash:
    return BlockHash(bytes([i % ROWS]) * 32)


def _keyed(kind: type[DiskLoadStoreSpec] | type[RemoteLoadStoreSpec], to_store: bool):  # type: ignore[no-untyped-def]
    def valid(i: int) -> TransferSpec:
        cpu = CPULoadStoreSpec((BlockId(i % ROWS),))
        keyed = kind((BlockId(i % ROWS),), (_key(i),))
        return (cpu, keyed) if to_store else (keyed, cpu)

    return valid


def _host_pages() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (ROWS, ROW_BYTES), dtype=torch.uint8, generator=gen)


PAIRS = [
    "gpu_to_cpu",
    "cpu_to_gpu",
    "cpu_to_disk",
    "disk_to_cpu",
    "cpu_to_remote",
    "remote_to_cpu",
]


@pytest.fixture(params=PAIRS)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    pair = request.param
    if pair in ("gpu_to_cpu", "cpu_to_gpu"):
        kv = make_kv(KVLayout.KV_FIRST, torch.float16, 8)
        handlers = CpuGpuOffloadingHandlers(kv, GPU_BLOCK_SIZE, 2 * GPU_BLOCK_SIZE, 4)
        if pair == "gpu_to_cpu":
            bad = (GPULoadStoreSpec((0,)), CPULoadStoreSpec((0,)))
            yield Case(handlers.gpu_to_cpu_handler, _store, bad)
        else:
            bad = (CPULoadStoreSpec((9,)), GPULoadStoreSpec((0, 1)))
            yield Case(handlers.cpu_to_gpu_handler, _load, bad)
        handlers.shutdown()
    elif pair in ("cpu_to_disk", "disk_to_cpu"):
        store = DiskStore.open(tmp_path, FP, 4 * ROWS * block_file_size(ROW_BYTES))
        pages = _host_pages()
        for row in range(ROWS):  # every key a load may name is there
            store.write(_key(row), pages[row].numpy())
        disk = CpuDiskOffloadingHandlers(pages, store, io_threads=2)
        bad_keyed = DiskLoadStoreSpec((BlockId(0),), (_key(0),))
        if pair == "cpu_to_disk":
            bad = (GPULoadStoreSpec((BlockId(0),)), bad_keyed)
            yield Case(disk.cpu_to_disk_handler, _keyed(DiskLoadStoreSpec, True), bad)
        else:
            bad = (bad_keyed, CPULoadStoreSpec((BlockId(ROWS),)))  # a row out of range
            yield Case(disk.disk_to_cpu_handler, _keyed(DiskLoadStoreSpec, False), bad)
        disk.shutdown()
        store.close()
    else:
        server = RedisServer(tmp_path / "redis").start()
        remote_store = RemoteStore.open(
            FP, RemoteOptions(url=server.url, timeout_s=5.0, max_connections=5), environ={}
        )
        pages = _host_pages()
        remote_store.write_many([_key(r) for r in range(ROWS)], [p.numpy() for p in pages])
        remote = CpuRemoteOffloadingHandlers(pages, remote_store, io_threads=2)
        bad_keyed = RemoteLoadStoreSpec((BlockId(0),), (_key(0),))
        if pair == "cpu_to_remote":
            bad = (GPULoadStoreSpec((BlockId(0),)), bad_keyed)
            yield Case(remote.cpu_to_remote_handler, _keyed(RemoteLoadStoreSpec, True), bad)
        else:
            bad = (bad_keyed, CPULoadStoreSpec((BlockId(ROWS),)))
            yield Case(remote.remote_to_cpu_handler, _keyed(RemoteLoadStoreSpec, False), bad)
        remote.shutdown()
        remote_store.close()
        server.stop()


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
