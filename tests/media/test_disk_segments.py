"""DiskStore's segment layout: consecutive slots, one read per run, the index, restarts.

``test_disk`` tests the store's contract (round trips, corruption, crashes, capacity);
this module tests what the segment files add to it.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import kvtier.media.disk as disk_module
from kvtier.blocks import BlockHash, BlockId
from kvtier.errors import IntegrityError, TransferError
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.media import disk_layout
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import (
    HEADER_REGION,
    LAYOUT,
    RECORD_BYTES,
    block_file_size,
    encode_record,
    find_block,
)
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers

FP = b"\x44" * 32
BLOCK = 16 * 1024
SLOT = block_file_size(BLOCK)


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def payload(i: int) -> np.ndarray:
    out = aligned_empty(BLOCK)
    out[:] = np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)
    return out


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> int:
    """Segments of 3 slots, so that tests cross segment boundaries."""
    monkeypatch.setattr(disk_layout, "SEGMENT_BYTES", 3 * SLOT)
    return 3


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskStore]:
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    yield s
    s.close()


def slot_number(store: DiskStore, k: bytes) -> int:
    where = store.locate(k)
    assert where is not None
    path, offset = where
    segment = int(path.stem.split("-")[1])
    return segment * disk_layout.slots_per_segment(SLOT) + offset // SLOT


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch the store's ``pread_all``; the list gets each call's byte count."""
    calls: list[int] = []
    real = disk_module.pread_all

    def counting(fd: int, buffers: list[np.ndarray], offset: int) -> int:
        calls.append(sum(b.nbytes for b in buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(disk_module, "pread_all", counting)
    return calls


def test_blocks_stored_together_sit_together_and_load_with_one_read(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [key(i) for i in range(8)]
    assert store.write_blocks(keys, [payload(i) for i in range(8)]) == 8 * SLOT
    assert [slot_number(store, k) for k in keys] == list(range(8))
    assert store.runs(keys) == [list(range(8))]
    assert store.runs(keys, max_bytes=3 * BLOCK) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert store.runs(keys[::-1]) == [[i] for i in range(8)]  # backwards: no run
    reads = count_reads(monkeypatch)
    outs = [aligned_empty(BLOCK) for _ in keys]
    assert store.read_blocks(keys, outs) == []
    assert reads == [8 * SLOT]  # one preadv for the eight
    for i, out in enumerate(outs):
        assert np.array_equal(out, payload(i))


def test_runs_stop_at_segment_ends(
    tmp_path: Path, small_segments: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    keys = [key(i) for i in range(8)]
    s.write_blocks(keys, [payload(i) for i in range(8)])
    assert sorted(p.name for p in s.directory.glob("*.seg")) == [
        f"{SLOT}-0.seg",
        f"{SLOT}-1.seg",
        f"{SLOT}-2.seg",
    ]
    assert s.runs(keys) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    reads = count_reads(monkeypatch)
    outs = [aligned_empty(BLOCK) for _ in keys]
    assert s.read_blocks(keys, outs) == []
    assert reads == [3 * SLOT, 3 * SLOT, 2 * SLOT]
    assert all(np.array_equal(o, payload(i)) for i, o in enumerate(outs))
    s.close()


def test_a_job_evicting_an_older_job_takes_its_slots(store: DiskStore) -> None:
    a, b, c = ([key(10 * j + i) for i in range(4)] for j in range(3))
    store.write_blocks(a, [payload(i) for i in range(4)])
    store.write_blocks(b, [payload(i) for i in range(4)])
    files = sorted((p.name, p.stat().st_size) for p in store.directory.glob("*.seg"))
    store.write_blocks(c, [payload(20 + i) for i in range(4)], evict=a)
    assert [slot_number(store, k) for k in c] == [0, 1, 2, 3]
    assert not any(k in store for k in a)
    assert sorted((p.name, p.stat().st_size) for p in store.directory.glob("*.seg")) == files
    outs = [aligned_empty(BLOCK) for _ in c]
    assert store.read_blocks(c, outs) == []
    assert all(np.array_equal(o, payload(20 + i)) for i, o in enumerate(outs))


def test_scattered_free_slots_are_used_when_no_run_is_left(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 6 * SLOT)
    s.write_blocks([key(i) for i in range(6)], [payload(i) for i in range(6)])
    s.delete(key(1))
    s.delete(key(4))
    s.write_blocks([key(7), key(8)], [payload(7), payload(8)])  # no run of 2: slots 1, 4
    assert [slot_number(s, key(7)), slot_number(s, key(8))] == [1, 4]
    out = aligned_empty(BLOCK)
    s.read_into(key(8), out)
    assert np.array_equal(out, payload(8))
    s.close()


def test_segment_files_grow_with_use_and_never_past_the_capacity(
    tmp_path: Path, small_segments: int
) -> None:
    s = DiskStore.open(tmp_path, FP, 8 * SLOT)
    assert not list(s.directory.glob("*.seg"))  # nothing allocated before it is needed
    s.write(key(0), payload(0))
    assert [p.stat().st_size for p in s.directory.glob("*.seg")] == [3 * SLOT]
    for i in range(1, 8):
        s.write(key(i), payload(i))
    sizes = sorted(p.stat().st_size for p in s.directory.glob("*.seg"))
    assert sizes == [2 * SLOT, 3 * SLOT, 3 * SLOT]  # 8 slots: the last segment is short
    with pytest.raises(TransferError, match="full"):
        s.write(key(8), payload(8))
    with pytest.raises(TransferError, match="full"):  # all or nothing
        s.write_blocks([key(8), key(9)], [payload(8), payload(9)], evict=[key(0)])
    assert len(s) == 7 and key(8) not in s and s.free_bytes == SLOT
    s.close()


def test_the_index_survives_a_restart_and_a_stale_record_is_a_miss(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    s.write_blocks([key(1), key(2)], [payload(1), payload(2)])
    s.close()
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert sorted(b.key for b in s.recovered) == [key(1), key(2)]
    assert slot_number(s, key(2)) == 1
    s.close()
    # A record claiming key 1 in slot 1 (which holds key 2's bytes), newer than the
    # true one: the kind of entry a crash between a slot's reuse and its record leaves.
    index = s.directory / f"{SLOT}.idx"
    with open(index, "r+b") as f:
        f.seek(RECORD_BYTES)
        f.write(encode_record(key(1), 1 << 62))
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert [b.key for b in s.recovered] == [key(1)]  # key 2's record was overwritten
    out = aligned_empty(BLOCK)
    out[:] = 7
    with pytest.raises(IntegrityError) as info:
        s.read_into(key(1), out)
    assert info.value.reason == "key_mismatch" and not out.any()
    assert len(s) == 0
    s.close()


def test_the_older_of_two_records_of_a_key_is_dropped(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    s.write(key(1), payload(1))
    s.write(key(2), payload(2))
    s.close()
    with open(s.directory / f"{SLOT}.idx", "r+b") as f:
        f.seek(RECORD_BYTES)
        f.write(encode_record(key(1), 1))  # slot 1 says key 1, older than slot 0's
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert [b.key for b in s.recovered] == [key(1)] and slot_number(s, key(1)) == 0
    out = aligned_empty(BLOCK)
    s.read_into(key(1), out)
    assert np.array_equal(out, payload(1))
    s.close()
    assert find_block(s.directory, key(1)) == (s.directory / f"{SLOT}-0.seg", 0)
    with open(s.directory / f"{SLOT}.idx", "rb") as f:
        f.seek(RECORD_BYTES)
        assert f.read(RECORD_BYTES) == bytes(RECORD_BYTES), "the stale record was cleared"


def test_blocks_of_the_file_per_block_layout_are_misses(tmp_path: Path) -> None:
    """Layout v1 (one ``.kvb`` file per block) is another directory: never listed."""
    old = tmp_path / "kvtier-disk-v1" / FP.hex() / key(1).hex()[:2]
    old.mkdir(parents=True)
    (old / f"{key(1).hex()}.kvb").write_bytes(bytes(HEADER_REGION + BLOCK))
    assert LAYOUT == "kvtier-disk-v2"
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert s.recovered == () and key(1) not in s
    with pytest.raises(TransferError, match="not on disk"):
        s.read_into(key(1), aligned_empty(BLOCK))
    s.close()


def test_a_torn_slot_fails_its_load_and_the_block_can_be_stored_again(
    store: DiskStore,
) -> None:
    """Half a slot's payload overwritten (a torn write): the load job fails naming the
    block, the block is forgotten (a miss: the engine recomputes), and storing the
    recomputed block again works."""
    pages = torch.frombuffer(aligned_empty(4 * BLOCK), dtype=torch.uint8).view(4, BLOCK)
    pages[:2] = torch.from_numpy(np.stack([payload(1), payload(2)]))
    handlers = CpuDiskOffloadingHandlers(pages, store, io_threads=2)
    ids = (BlockId(0), BlockId(1))
    keys = (BlockHash(key(1)), BlockHash(key(2)))
    store_job = (CPULoadStoreSpec(ids), DiskLoadStoreSpec(ids, keys))
    load_job = (DiskLoadStoreSpec(ids, keys), CPULoadStoreSpec((BlockId(2), BlockId(3))))
    handlers.cpu_to_disk_handler.transfer_async(1, store_job)
    handlers.cpu_to_disk_handler.wait([1])
    assert handlers.cpu_to_disk_handler.get_finished()[0].success
    where = store.locate(key(2))
    assert where is not None
    with open(where[0], "r+b") as f:
        f.seek(where[1] + HEADER_REGION + BLOCK // 2)
        f.write(bytes(BLOCK // 2))
    handlers.disk_to_cpu_handler.transfer_async(2, load_job)
    handlers.disk_to_cpu_handler.wait([2])
    [result] = handlers.disk_to_cpu_handler.get_finished()
    assert not result.success and result.error is not None
    assert "checksum_mismatch" in result.error and key(2).hex()[:16] in result.error
    assert key(2) not in store and key(1) in store
    assert not pages[3].any()
    handlers.cpu_to_disk_handler.transfer_async(3, store_job)  # recomputed, stored again
    handlers.cpu_to_disk_handler.wait([3])
    assert handlers.cpu_to_disk_handler.get_finished()[0].success
    handlers.disk_to_cpu_handler.transfer_async(4, load_job)
    handlers.disk_to_cpu_handler.wait([4])
    assert handlers.disk_to_cpu_handler.get_finished()[0].success
    assert torch.equal(pages[2:], pages[:2])
    handlers.shutdown()


def test_concurrent_writers_and_readers_never_see_wrong_bytes(tmp_path: Path) -> None:
    """Four writers, each storing batches that evict its own previous batch, and four
    readers loading any key: a load returns its block's exact bytes or fails, never
    anything else; at the end the accounting matches what is stored."""
    s = DiskStore.open(tmp_path, FP, 40 * SLOT)
    stop = threading.Event()
    errors: list[str] = []
    loaded = [0]

    def writer(w: int) -> None:
        previous: list[bytes] = []
        for n in range(30):
            keys = [key(1000 * w + 4 * n + i) for i in range(4)]
            try:
                s.write_blocks(keys, [payload(int.from_bytes(k[:4])) for k in keys], previous)
            except TransferError as e:
                errors.append(f"writer {w}: {e}")
            previous = keys

    def reader(r: int) -> None:
        rng = random.Random(r)
        out = aligned_empty(BLOCK)
        while not stop.is_set():
            keys = s.keys()
            if not keys:
                continue
            k = rng.choice(keys)
            try:
                s.read_into(k, out)
            except TransferError:
                continue  # evicted or overwritten meanwhile: a miss
            if not np.array_equal(out, payload(int.from_bytes(k[:4]))):
                errors.append(f"wrong bytes for {k.hex()}")
            loaded[0] += 1

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    readers = [threading.Thread(target=reader, args=(r,)) for r in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert loaded[0] > 0
    assert len(s) == 16 and s.used_bytes == 16 * SLOT
    for k in list(s.keys()):
        out = aligned_empty(BLOCK)
        s.read_into(k, out)
        assert np.array_equal(out, payload(int.from_bytes(k[:4])))
    s.close()


def test_a_load_racing_the_reuse_of_its_slot_is_a_miss_not_wrong_bytes(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of key 1 starts, then key 1 is evicted and its slot rewritten with key 2
    before the bytes arrive: the load fails verification and key 2 stays stored."""
    store.write(key(1), payload(1))
    real = disk_module.pread_all

    def racing(fd: int, buffers: list[np.ndarray], offset: int) -> int:
        monkeypatch.setattr(disk_module, "pread_all", real)
        store.write(key(2), payload(2), evict=[key(1)])  # takes slot 0
        return real(fd, buffers, offset)

    monkeypatch.setattr(disk_module, "pread_all", racing)
    out = aligned_empty(BLOCK)
    with pytest.raises(IntegrityError) as info:
        store.read_into(key(1), out)
    assert info.value.reason == "key_mismatch" and not out.any()
    assert store.keys() == [key(2)]
    store.read_into(key(2), out)
    assert np.array_equal(out, payload(2))


def test_close_saves_the_last_use_of_loaded_blocks(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    s.write_blocks([key(i) for i in range(3)], [payload(i) for i in range(3)])
    s.read_into(key(0), aligned_empty(BLOCK))
    s.close()
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert [b.key for b in s.recovered][-1] == key(0)
    s.close()


def test_files_are_few(tmp_path: Path) -> None:
    """200 blocks: one segment and one index, not 200 files."""
    s = DiskStore.open(tmp_path, FP, 256 * SLOT)
    for j in range(0, 200, 20):
        s.write_blocks([key(i) for i in range(j, j + 20)], [payload(i) for i in range(20)])
    assert sorted(os.listdir(s.directory)) == [f"{SLOT}-0.seg", f"{SLOT}.idx", "lock"]
    s.close()


def test_a_block_stored_twice_then_deleted_stays_deleted_after_a_restart(
    tmp_path: Path,
) -> None:
    """Found by the state machine: the second store of a key moved it to a new slot
    but left the old slot's record, so after a delete the restart listed the key
    again (with its first bytes). The old slot's record is now cleared."""
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    s.write(key(1), payload(1))
    s.write(key(1), payload(2))
    assert slot_number(s, key(1)) == 1
    s.delete(key(1))
    s.close()
    s = DiskStore.open(tmp_path, FP, 64 * SLOT)
    assert s.recovered == () and key(1) not in s
    s.close()


def test_a_full_cache_keeps_each_stretch_of_a_job_in_consecutive_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exactly full (16 slots): job B evicts job A. Each store stretch (4 blocks here)
    deletes the evicted blocks next to its own share, so it finds a run of 4 free
    slots and B loads with 4 reads, not 16."""
    import kvtier.worker.cpu_disk as cpu_disk_module

    monkeypatch.setattr(cpu_disk_module, "MAX_RUN_BYTES", 4 * BLOCK)
    s = DiskStore.open(tmp_path, FP, 16 * SLOT)
    pages = torch.frombuffer(aligned_empty(16 * BLOCK), dtype=torch.uint8).view(16, BLOCK)
    handlers = CpuDiskOffloadingHandlers(pages, s, io_threads=1)
    ids = tuple(BlockId(i) for i in range(16))
    a = tuple(BlockHash(key(i)) for i in range(16))
    b = tuple(BlockHash(key(100 + i)) for i in range(16))
    store = handlers.cpu_to_disk_handler
    store.transfer_async(1, (CPULoadStoreSpec(ids), DiskLoadStoreSpec(ids, a)))
    store.transfer_async(2, (CPULoadStoreSpec(ids), DiskLoadStoreSpec(ids, b, a)))
    store.wait([1, 2])
    assert all(r.success for r in store.get_finished())
    assert s.runs([bytes(k) for k in b], max_bytes=4 * BLOCK) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    handlers.shutdown()
    s.close()
