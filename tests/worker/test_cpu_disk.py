"""CPU<->disk handlers: round trips, per-job failures, FIFO completion, never raising."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.blocks import BlockHash, BlockId
from kvtier.errors import TransferError
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import HEADER_REGION, block_file_size
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
from kvtier.worker.handler import OffloadingHandler, TransferResult

FP = b"\x33" * 32
BLOCK = 16 * 1024
NUM = 16


def key(i: int) -> BlockHash:
    return BlockHash(bytes([i]) * 32)


def cpu_pages(aligned: bool) -> torch.Tensor:
    if aligned:
        return torch.frombuffer(aligned_empty(NUM * BLOCK), dtype=torch.uint8).view(NUM, BLOCK)
    return torch.zeros(NUM, BLOCK, dtype=torch.uint8)


def store_spec(rows: list[int], keys: list[int]) -> tuple[CPULoadStoreSpec, DiskLoadStoreSpec]:
    ids = tuple(BlockId(r) for r in rows)
    return CPULoadStoreSpec(ids), DiskLoadStoreSpec(ids, tuple(key(k) for k in keys))


def load_spec(keys: list[int], rows: list[int]) -> tuple[DiskLoadStoreSpec, CPULoadStoreSpec]:
    cpu, disk = store_spec(rows, keys)
    return disk, cpu


def run(handler: OffloadingHandler, jobs: dict[int, object]) -> dict[int, TransferResult]:
    for job_id, spec in jobs.items():
        handler.transfer_async(job_id, spec)  # type: ignore[arg-type]
    handler.wait(list(jobs))
    results = handler.get_finished()
    assert [r.job_id for r in results] == list(jobs)
    return {r.job_id: r for r in results}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskStore]:
    s = DiskStore.open(tmp_path, FP, 64 * block_file_size(BLOCK))
    yield s
    s.close()


@pytest.fixture(params=[True, False], ids=["aligned", "unaligned"])
def handlers(
    request: pytest.FixtureRequest, store: DiskStore
) -> Iterator[CpuDiskOffloadingHandlers]:
    pages = cpu_pages(request.param)
    pages[:] = torch.randint(0, 256, pages.shape, dtype=torch.uint8)
    h = CpuDiskOffloadingHandlers(pages, store, io_threads=4)
    h.pages = pages  # type: ignore[attr-defined]
    yield h
    h.shutdown()


def test_round_trip(handlers: CpuDiskOffloadingHandlers) -> None:
    pages = handlers.pages  # type: ignore[attr-defined]
    original = pages.clone()
    stored = run(
        handlers.cpu_to_disk_handler,
        {1: store_spec([0, 1, 2], [0, 1, 2]), 2: store_spec([3, 4], [3, 4])},
    )
    assert all(r.success and r.error is None for r in stored.values())
    assert stored[1].bytes_moved == 3 * BLOCK and stored[1].seconds >= 0
    loaded = run(handlers.disk_to_cpu_handler, {3: load_spec([4, 0, 2, 1, 3], [8, 9, 10, 11, 12])})
    assert loaded[3].success and loaded[3].bytes_moved == 5 * BLOCK
    for src, dst in zip([4, 0, 2, 1, 3], [8, 9, 10, 11, 12], strict=True):
        assert torch.equal(pages[dst], original[src])


def test_failed_block_fails_its_job_only(
    handlers: CpuDiskOffloadingHandlers, store: DiskStore
) -> None:
    pages = handlers.pages  # type: ignore[attr-defined]
    run(handlers.cpu_to_disk_handler, {1: store_spec([0, 1, 2], [0, 1, 2])})
    where = store.locate(key(1))
    assert where is not None
    with open(where[0], "r+b") as f:
        f.seek(where[1] + HEADER_REGION + 5)
        byte = f.read(1)[0]
        f.seek(where[1] + HEADER_REGION + 5)
        f.write(bytes([byte ^ 0xFF]))
    pages[8:12] = 0xAB
    results = run(
        handlers.disk_to_cpu_handler,
        {
            2: load_spec([0, 1, 2], [8, 9, 10]),
            3: load_spec([0], [11]),
            4: load_spec([7], [12]),  # never stored
        },
    )
    assert not results[2].success and results[2].bytes_moved == 0
    assert results[2].error is not None
    assert "checksum_mismatch" in results[2].error and key(1).hex()[:16] in results[2].error
    assert not pages[9].any(), "the corrupt block's page holds zeros, not plausible bytes"
    assert results[3].success
    assert not results[4].success and "not on disk" in str(results[4].error)
    assert key(1) not in store and store.locate(key(1)) is None


def test_disk_full_fails_the_store_job_cleanly(tmp_path: Path) -> None:
    store = DiskStore.open(tmp_path, FP, 2 * block_file_size(BLOCK))
    h = CpuDiskOffloadingHandlers(cpu_pages(True), store, io_threads=2)
    results = run(h.cpu_to_disk_handler, {1: store_spec([0, 1, 2], [0, 1, 2])})
    assert not results[1].success and "full" in str(results[1].error)
    # all or nothing: no block the scheduler will think failed is left taking room
    assert len(store) == 0 and store.used_bytes == 0
    h.shutdown()
    store.close()


class GatedStore:
    """A store whose writes of chosen keys wait for a gate: pool order made explicit."""

    def __init__(self, inner: DiskStore, gated: set[bytes]) -> None:
        self.inner = inner
        self.gated = gated
        self.gate = threading.Event()

    def write_blocks(
        self, keys: list[bytes], payloads: list[np.ndarray], evict: Sequence[bytes] = ()
    ) -> int:
        if self.gated & set(keys):
            self.gate.wait()
        return self.inner.write_blocks(keys, payloads, evict)

    def read_blocks(self, keys: list[bytes], outs: list[np.ndarray]) -> list[TransferError]:
        if self.gated & set(keys):
            self.gate.wait()
        return self.inner.read_blocks(keys, outs)

    def runs(self, keys: list[bytes]) -> list[list[int]]:
        return self.inner.runs(keys)


def test_jobs_finish_in_submission_order(store: DiskStore) -> None:
    gated = GatedStore(store, {key(0)})
    h = CpuDiskOffloadingHandlers(cpu_pages(True), gated, io_threads=4)  # type: ignore[arg-type]
    handler = h.cpu_to_disk_handler
    assert handler.transfer_async(1, store_spec([0], [0]))
    assert handler.transfer_async(2, store_spec([1, 2], [1, 2]))
    handler.wait([2])  # job 2 is done while job 1 is held back ...
    assert key(1) in store and key(2) in store and key(0) not in store
    assert handler.get_finished() == []  # ... yet it is not reported before job 1
    gated.gate.set()
    handler.wait([1, 2])
    assert [r.job_id for r in handler.get_finished()] == [1, 2]
    handler.wait([1, 2, 99])  # reported and unknown ids do not block
    h.shutdown()


def test_invalid_specs_are_refused_and_reported_in_order(
    handlers: CpuDiskOffloadingHandlers,
) -> None:
    handler = handlers.cpu_to_disk_handler
    cpu, disk = store_spec([0], [0])
    bad: list[object] = [
        (disk, cpu),  # wrong direction
        (GPULoadStoreSpec((BlockId(0),)), disk),
        (cpu, DiskLoadStoreSpec((BlockId(0),), (key(0), key(1)))),  # length mismatch
        store_spec([NUM], [0]),  # row out of range
        "not a spec",
    ]
    assert handler.transfer_async(1, store_spec([0], [0]))
    for job_id, spec in enumerate(bad, start=2):
        assert handler.transfer_async(job_id, spec) is False  # type: ignore[arg-type]
    handler.wait(range(1, 7))
    results = handler.get_finished()
    assert [r.job_id for r in results] == [1, 2, 3, 4, 5, 6]
    assert results[0].success
    assert all(not r.success and "invalid transfer spec" in str(r.error) for r in results[1:])
    loads = handlers.disk_to_cpu_handler
    assert not loads.transfer_async(7, load_spec([0, 1], [3, 3]))  # two blocks, one page


def test_empty_job_succeeds(handlers: CpuDiskOffloadingHandlers) -> None:
    results = run(handlers.disk_to_cpu_handler, {1: load_spec([], [])})
    assert results[1].success and results[1].bytes_moved == 0


def test_after_shutdown_jobs_are_refused(handlers: CpuDiskOffloadingHandlers) -> None:
    run(handlers.cpu_to_disk_handler, {1: store_spec([0], [0])})
    handlers.shutdown()
    handlers.shutdown()  # idempotent
    assert not handlers.cpu_to_disk_handler.transfer_async(2, store_spec([1], [1]))
    [result] = handlers.cpu_to_disk_handler.get_finished()
    assert result.job_id == 2 and "shut down" in str(result.error)


class BrokenStore:
    """A store with a bug: the handler reports it and keeps going."""

    def write_blocks(
        self, keys: list[bytes], payloads: list[np.ndarray], evict: Sequence[bytes] = ()
    ) -> int:
        raise RuntimeError("bug in the store")

    def read_blocks(self, keys: list[bytes], outs: list[np.ndarray]) -> list[TransferError]:
        raise TransferError("disk read failed: EIO")

    def runs(self, keys: list[bytes]) -> list[list[int]]:
        return [[i] for i in range(len(keys))]


def test_handler_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    h = CpuDiskOffloadingHandlers(cpu_pages(False), BrokenStore(), io_threads=2)  # type: ignore[arg-type]
    stored = run(h.cpu_to_disk_handler, {1: store_spec([0, 1], [0, 1])})
    assert not stored[1].success and "bug in the store" in str(stored[1].error)
    loaded = run(h.disk_to_cpu_handler, {2: load_spec([0], [0])})
    assert not loaded[2].success and "EIO" in str(loaded[2].error)
    h.shutdown()


def test_rejects_pages_it_cannot_use(store: DiskStore) -> None:
    for bad in (
        torch.zeros(4, 8, dtype=torch.float32),
        torch.zeros(32, dtype=torch.uint8),
        torch.zeros(8, 4, dtype=torch.uint8).t(),
    ):
        with pytest.raises(ValueError):
            CpuDiskOffloadingHandlers(bad, store)


def test_a_store_deletes_the_keys_its_spec_names_evicted_first(tmp_path: Path) -> None:
    """The scheduler's evictions reach the disk inside the store job's spec: a full
    tier stays usable, and the handler keeps no slot index of its own."""
    store = DiskStore.open(tmp_path, FP, 2 * block_file_size(BLOCK))
    pages = cpu_pages(True)
    h = CpuDiskOffloadingHandlers(pages, store)
    store.write(key(9), pages[0].numpy())  # found at start-up

    def store_evicting(job_id: int, k: int, evicted: tuple[int, ...]) -> TransferResult:
        disk = DiskLoadStoreSpec((BlockId(0),), (key(k),), tuple(key(e) for e in evicted))
        return run(h.cpu_to_disk_handler, {job_id: (CPULoadStoreSpec((BlockId(0),)), disk)})[job_id]

    assert store_evicting(1, 1, ()).success
    assert not store_evicting(2, 2, ()).success  # full: nothing named evicted
    assert store_evicting(3, 2, (9,)).success  # key 9 deleted first
    assert store_evicting(4, 3, (1,)).success
    assert sorted(store.keys()) == [key(2), key(3)]
    h.shutdown()
    store.close()
