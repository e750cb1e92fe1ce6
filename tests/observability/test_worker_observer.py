"""``OffloadingWorker.add_observer``: every finished job reaches the observer once, with
its spec, and a raising observer does not take the worker down."""

from __future__ import annotations

import logging

import pytest

from kvtier.blocks import BlockId, Medium
from kvtier.observability.failures import FailureKey
from kvtier.observability.observer import EngineObserver
from kvtier.scheduler import CPUOffloadingManager
from kvtier.specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.worker import OffloadingWorker
from kvtier.worker.handler import TransferResult, TransferSpec


def test_each_job_is_observed_once_with_its_spec(caplog: pytest.LogCaptureFixture) -> None:
    worker = OffloadingWorker()  # no handlers: every job fails, as a routing failure
    seen: list[tuple[TransferSpec | None, TransferResult]] = []
    worker.add_observer(lambda spec, result: seen.append((spec, result)))

    def broken(spec: TransferSpec | None, result: TransferResult) -> None:
        raise RuntimeError("observer bug")

    worker.add_observer(broken)
    load = (CPULoadStoreSpec((BlockId(0), BlockId(1))), GPULoadStoreSpec((BlockId(5), BlockId(6))))
    write = (CPULoadStoreSpec((BlockId(2),)), DiskLoadStoreSpec((BlockId(0),), (b"k",)))
    assert worker.transfer_async(1, load) is False
    assert worker.transfer_async(2, write) is False
    with caplog.at_level(logging.ERROR, logger="kvtier.worker.handler"):
        results = worker.get_finished()
    assert [r.job_id for r in results] == [1, 2]
    assert [(spec, r.job_id) for spec, r in seen] == [(load, 1), (write, 2)]
    assert sum("observer" in r.getMessage() for r in caplog.records) == 2
    assert worker.get_finished() == [] and len(seen) == 2

    observer = EngineObserver(CPUOffloadingManager(4, 16), 1024)
    for spec, result in seen:
        observer.on_transfer(spec, result)
    assert observer.failures.take() == {
        FailureKey(Medium.CPU, "load", "invalid"): 2,
        FailureKey(Medium.DISK, "store", "invalid"): 1,
    }
