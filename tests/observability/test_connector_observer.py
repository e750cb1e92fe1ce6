"""``OffloadingConnector.add_observer``: every finished job reaches the observer once, with
its spec, in the engine's process (also when the worker half runs in a child), and a
raising observer does not take the connector down."""

from __future__ import annotations

import logging

import pytest
import torch

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.jobs import TransferResult, TransferSpec
from kvtier.keys import ModelFingerprint
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.observability.failures import FailureKey
from kvtier.observability.observer import EngineObserver
from kvtier.offloading_spec import KVGeometry, OffloadingSpec

LAYERS, PAGE, HEADS, HEAD_DIM = 2, 4, 2, 8
PAGE_BYTES = LAYERS * 2 * PAGE * HEADS * HEAD_DIM * 2  # float16
FP = ModelFingerprint(model_id="observer", dtype="float16", kv_layout="kv_first", block_size=PAGE)
GEOMETRY = KVGeometry(gpu_block_size=PAGE, page_bytes=PAGE_BYTES, fingerprint=FP)


def _connector(worker_process: bool) -> OffloadingConnector:
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * PAGE_BYTES, "block_size": PAGE}, GEOMETRY)
    connector = OffloadingConnector(spec, worker_process=worker_process)
    shape = (2, 8, PAGE, HEADS, HEAD_DIM)
    connector.register_kv_caches([torch.ones(shape, dtype=torch.float16)] * LAYERS, PAGE)
    return connector


@pytest.mark.parametrize("worker_process", [False, True])
def test_each_job_is_observed_once_with_its_spec(
    worker_process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    connector = _connector(worker_process)
    seen: list[tuple[TransferSpec | None, TransferResult]] = []
    connector.add_observer(lambda spec, result: seen.append((spec, result)))

    def broken(spec: TransferSpec | None, result: TransferResult) -> None:
        raise RuntimeError("observer bug")

    connector.add_observer(broken)
    keys = [BlockHash(bytes([i]) * 32) for i in range(3)]
    try:
        with caplog.at_level(logging.ERROR, logger="kvtier.engine.offload_connector"):
            connector.scheduler.pages_full("r", keys, 3, [BlockId(5), BlockId(6), BlockId(7)])
            connector._send(write_through=False)
            connector.flush()
    finally:
        connector.close()
    assert len(seen) == 1, "one store job for the three full pages"
    spec, result = seen[0]
    assert result.success and result.bytes_moved == 3 * PAGE_BYTES
    assert spec is not None
    src, dst = spec
    assert isinstance(src, GPULoadStoreSpec) and list(src.block_ids) == [5, 6, 7]
    assert isinstance(dst, CPULoadStoreSpec) and len(dst.block_ids) == 3
    assert sum("observer" in r.getMessage() for r in caplog.records) == 1


def test_failed_jobs_are_counted_by_tier_and_reason() -> None:
    """The engine observer classifies a failed job by the tier it touched."""
    load = (CPULoadStoreSpec((BlockId(0), BlockId(1))), GPULoadStoreSpec((BlockId(5), BlockId(6))))
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * PAGE_BYTES, "block_size": PAGE}, GEOMETRY)
    observer = EngineObserver(spec.get_manager(), PAGE_BYTES)
    observer.on_transfer(load, TransferResult.failed(1, "invalid transfer spec: bad ids"))
    assert observer.failures.take() == {FailureKey(Medium.CPU, "load", "invalid"): 2}
