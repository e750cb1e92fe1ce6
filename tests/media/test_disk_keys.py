"""The disk tier's index on keys that look alike: every block stored is a hit, exactly.

Prefix-chained block keys are digests and rarely share more than a byte or two, so a
disk index that keyed its slots on a truncated key, a bucket of a hash, or a key with
its trailing zero bytes stripped would pass every other test. Such an index hands a
load the slot of another block; the header check catches it (``key_mismatch``) and the
load becomes a miss, never wrong bytes. So the only symptom is a hit count one short:
these tests count hits exactly, through ``DiskStore`` (in one process and after a
restart, which rebuilds the index from the index files' records) and through the
CPU<->disk handlers, with keys built to share all but their last byte, all but their
first, or to differ only by trailing zero bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import MAX_KEY_BYTES, block_file_size
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

FP = b"\x5e" * 32
BLOCK = 4096
FAMILIES = {
    # equal in all but the last byte (an index on a key prefix confuses them)
    "last-byte": [b"\x5a" * 31 + bytes([i]) for i in range(24)],
    # equal in all but the first byte (an index on a key suffix, or on its tail's hash)
    "first-byte": [bytes([i]) + b"\xa5" * 31 for i in range(24)],
    # one key and itself followed by zero bytes (a record read back without its length)
    "zero-tail": [b"\x77" * 20 + b"\x00" * n for n in range(12)],
    # the longest keys, equal in their first 119 bytes
    "longest": [b"\xc3" * (MAX_KEY_BYTES - 1) + bytes([i]) for i in range(8)],
}


def page(i: int) -> np.ndarray:
    """Block ``i``'s payload: every byte says which block it is."""
    out = aligned_empty(BLOCK)
    out[:] = i % 251 + 1
    return out


def hits(store: DiskStore, model: dict[bytes, int]) -> int:
    """Loads of every key of ``model`` that succeed with exactly the model's bytes."""
    count = 0
    for k, i in model.items():
        out = aligned_empty(BLOCK)
        if not store.read_blocks([k], [out]):
            assert np.array_equal(out, page(i)), f"wrong bytes for {k.hex()}"
            count += 1
    return count


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskStore]:
    s = DiskStore.open(tmp_path, FP, 64 * block_file_size(BLOCK))
    yield s
    s.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_keys_alike_are_each_a_hit_in_one_process_and_after_a_restart(
    tmp_path: Path, family: str
) -> None:
    keys = FAMILIES[family]
    s = DiskStore.open(tmp_path, FP, 64 * block_file_size(BLOCK))
    model: dict[bytes, int] = {}
    half = len(keys) // 2
    s.write_blocks(keys[:half], [page(i) for i in range(half)])  # one job, consecutive slots
    for i in range(half, len(keys)):
        s.write(keys[i], page(i))
    model.update({k: i for i, k in enumerate(keys)})
    assert hits(s, model) == len(keys)
    for k in keys[::3]:  # freed slots are reused by the rewrites below
        assert s.delete(k)
        del model[k]
    for n, k in enumerate(keys[::6]):  # stored again, other bytes
        s.write(k, page(100 + n))
        model[k] = 100 + n
    for n, k in enumerate(keys[1::4]):  # replaced in place: the old slot is freed
        s.write(k, page(200 + n))
        model[k] = 200 + n
    assert len(s) == len(model) and sorted(s.keys()) == sorted(model)
    assert hits(s, model) == len(model)
    s.close()
    s = DiskStore.open(tmp_path, FP, 64 * block_file_size(BLOCK))
    try:
        assert sorted(b.key for b in s.recovered) == sorted(model)
        assert hits(s, model) == len(model)
    finally:
        s.close()


def test_keys_alike_through_the_handlers_each_load_once(store: DiskStore) -> None:
    """Sixteen pages stored under keys equal in all but their last byte, in two jobs;
    each loaded in a job of its own into a zeroed page: 16 successful loads, exact."""
    keys = [BlockHash(k) for k in FAMILIES["last-byte"][:16]]
    pages = torch.frombuffer(aligned_empty(16 * BLOCK), dtype=torch.uint8).view(16, BLOCK)
    for i in range(16):
        pages[i] = torch.from_numpy(page(i))
    handlers = CpuDiskOffloadingHandlers(pages, store, io_threads=4)
    try:
        store_jobs = {
            0: (CPULoadStoreSpec(tuple(BlockId(r) for r in range(8))),
                DiskLoadStoreSpec(tuple(BlockId(r) for r in range(8)), tuple(keys[:8]))),
            1: (CPULoadStoreSpec(tuple(BlockId(r) for r in range(8, 16))),
                DiskLoadStoreSpec(tuple(BlockId(r) for r in range(8, 16)), tuple(keys[8:]))),
        }  # fmt: skip
        for job_id, spec in store_jobs.items():
            assert handlers.cpu_to_disk_handler.transfer_async(job_id, spec)
        handlers.cpu_to_disk_handler.wait(list(store_jobs))
        assert [r.success for r in handlers.cpu_to_disk_handler.get_finished()] == [True, True]
        pages.zero_()
        load = handlers.disk_to_cpu_handler
        for i, k in enumerate(keys):
            spec = (DiskLoadStoreSpec((BlockId(i),), (k,)), CPULoadStoreSpec((BlockId(i),)))
            assert load.transfer_async(100 + i, spec)
        load.wait([100 + i for i in range(16)])
        results = load.get_finished()
        assert sum(r.success for r in results) == 16, [r.error for r in results if not r.success]
        for i in range(16):
            assert np.array_equal(pages[i].numpy(), page(i)), f"page {i}"
    finally:
        handlers.shutdown()
