"""The scheduler half on its own: no engine, no torch, no worker -- only values.

Every test drives ``ConnectorScheduler`` over a real (pure-Python) tiering and plays
the worker half by answering its ``TransferJob`` values with ``TransferResult`` values.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.connector.scheduler_half import ConnectorScheduler, LoadDone, Progress
from kvtier.jobs import JobKind, TransferJob, TransferResult
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.tiering import TieredManager

PAGE = 4


def pages(n: int, tag: str = "p") -> list[BlockHash]:
    return [BlockHash(f"{tag}{i}".encode()) for i in range(n)]


def half(cpu_blocks: int = 16, f: int = 1, disk_blocks: int = 0) -> ConnectorScheduler:
    cpu = CPUOffloadingManager(num_blocks=cpu_blocks, block_size=PAGE * f)
    secondaries = []
    if disk_blocks:
        secondaries.append(
            TierManager(
                medium=Medium.DISK,
                num_blocks=disk_blocks,
                block_size=PAGE * f,
                policy=make_policy("lru", disk_blocks),
            )
        )
    return ConnectorScheduler(
        TieredManager(cpu, secondaries), block_size_factor=f, gpu_block_size=PAGE
    )


def finish(h: ConnectorScheduler, jobs: list[TransferJob], ok: bool = True) -> Progress:
    return h.on_finished(TransferResult(j.job_id, ok, 100 if ok else 0, 0.0) for j in jobs)


def store_all(h: ConnectorScheduler, keys: list[BlockHash], rid: str = "w") -> None:
    h.pages_full(rid, keys, len(keys), [BlockId(i) for i in range(len(keys))])
    finish(h, h.take_jobs())


@pytest.mark.parametrize(
    ("f", "num_pages", "num_tokens", "expected"),
    [
        (1, 4, 16, 3),  # the last token sits in page 3: pages 0..2 load
        (1, 4, 17, 4),  # the last token is in page 4: all four full pages load
        (2, 8, 32, 6),  # last token in page 7: blocks end on 2-page boundaries -> 6
        (2, 8, 30, 6),
        (4, 8, 32, 4),
    ],
)
def test_hits_never_reach_the_page_of_the_last_prompt_token(
    f: int, num_pages: int, num_tokens: int, expected: int
) -> None:
    h = half(f=f)
    keys = pages(num_pages)
    store_all(h, keys)
    assert h.num_external_hit_pages("r", keys, 0, num_tokens) == expected


def test_hits_start_past_the_gpu_hit_and_end_on_a_block_boundary() -> None:
    h = half(f=4)
    keys = pages(12)
    store_all(h, keys)
    # GPU holds pages 0..2; the load runs from page 3 to the end of block 2 (page 11),
    # short of the page of the last token (page 11 for 45 tokens) -> pages 3..7.
    assert h.num_external_hit_pages("r", keys, 3, 45) == 5
    assert h.num_external_hit_pages("r", keys, 3, 49) == 9


def test_a_load_emits_one_job_and_reports_its_pages() -> None:
    h = half(f=2)
    keys = pages(8)
    store_all(h, keys)
    hit = h.num_external_hit_pages("r", keys, 1, 33)
    assert hit == 7
    h.start_load("r", keys, 1, [BlockId(10 + i) for i in range(hit)])
    (job,) = h.take_jobs()
    assert job.kind is JobKind.LOAD
    assert isinstance(job.src, CPULoadStoreSpec) and len(job.src.block_ids) == 4
    assert job.dst == GPULoadStoreSpec(tuple(BlockId(10 + i) for i in range(7)), skip_count=1)
    progress = finish(h, [job])
    assert progress.loads == (LoadDone("r", 7),)
    stats = h.take_stats()
    assert (stats.loaded_blocks, stats.bytes_loaded, stats.hit_blocks) == (4, 100, {"CPU": 4})


def test_a_failed_load_reports_no_pages_and_counts_its_blocks() -> None:
    h = half()
    keys = pages(4)
    store_all(h, keys)
    h.start_load("r", keys, 0, [BlockId(0), BlockId(1), BlockId(2)])
    progress = finish(h, h.take_jobs(), ok=False)
    assert progress.loads == (LoadDone("r", 0),)
    assert h.take_stats().failed_loads == 3
    assert h.manager.primary.pins(keys[0]) == 0, "the failed load's pins were released"


def test_stores_ask_first_and_count_each_refused_block_once() -> None:
    # 3 slots: 2 free and 1 evictable. A run of 5 stores its head of 3; 2 are refused.
    h = half(cpu_blocks=3)
    store_all(h, pages(1, "old"))
    h.take_stats()
    keys = pages(5)
    h.pages_full("r", keys, 5, [BlockId(i) for i in range(5)])
    (job,) = h.take_jobs()
    assert job.kind is JobKind.STORE
    assert job.src == GPULoadStoreSpec((BlockId(0), BlockId(1), BlockId(2)))
    assert h.request_finished("r") is True, "its pages are still being read"
    assert finish(h, [job]).released == ("r",)
    stats = h.take_stats()
    assert (stats.stored_blocks, stats.refused_stores) == (3, 2)
    manager_stats = h.manager.primary.stats()
    assert manager_stats.stores_rejected == 0, "prepare_store was never refused"
    assert manager_stats.evictions == 1


def test_nothing_fits_nothing_is_asked_of_prepare_store() -> None:
    h = half(cpu_blocks=2)
    keys = pages(2)
    h.pages_full("a", keys, 2, [BlockId(0), BlockId(1)])  # both STORING: held
    h.pages_full("b", pages(3, "q"), 3, [BlockId(5), BlockId(6), BlockId(7)])
    assert [j.kind for j in h.take_jobs()] == [JobKind.STORE]
    assert h.take_stats().refused_stores == 3
    assert h.manager.primary.stats().stores_rejected == 0


def test_blocks_on_disk_are_promoted_then_loaded() -> None:
    h = half(cpu_blocks=2, disk_blocks=8)
    keys = pages(4)
    for i in range(0, 4, 2):  # through the CPU tier, two at a time, then to disk
        store_all(h, keys[: i + 2], rid=f"w{i}")
        writes = h.take_jobs()
        assert {j.kind for j in writes} == {JobKind.WRITE}
        assert all(isinstance(j.dst, DiskLoadStoreSpec) for j in writes)
        finish(h, writes)
    hit = h.num_external_hit_pages("r", keys, 0, 17)
    assert hit == 4
    h.start_load("r", keys, 0, [BlockId(i) for i in range(4)])
    promotions = h.take_jobs(write_through=False)
    assert [j.kind for j in promotions] == [JobKind.PROMOTE]
    assert len(promotions[0].src.block_ids) == 2  # type: ignore[attr-defined]
    assert finish(h, promotions).loads == ()
    (load,) = h.take_jobs(write_through=False)
    assert load.kind is JobKind.LOAD
    assert finish(h, [load]).loads == (LoadDone("r", 2),)
    stats = h.take_stats()
    assert stats.refused_loads == 2  # the CPU tier had room to promote two of four
    assert stats.hit_blocks == {Medium.DISK: 2}


def test_on_evict_stores_one_page_and_names_the_job_to_wait_for() -> None:
    h = ConnectorScheduler(
        TieredManager(CPUOffloadingManager(num_blocks=4, block_size=PAGE), []),
        block_size_factor=1,
        gpu_block_size=PAGE,
        store_policy="on_evict",
    )
    h.pages_full("r", pages(2), 2, [BlockId(0), BlockId(1)])
    assert h.take_jobs() == []
    job_id = h.gpu_evict(pages(1)[0], BlockId(7))
    (job,) = h.take_jobs()
    assert job.job_id == job_id and job.src == GPULoadStoreSpec((BlockId(7),))


def test_the_values_between_the_halves_are_frozen_slotted_and_pickle() -> None:
    h = half(cpu_blocks=2, disk_blocks=4)
    keys = pages(2)
    store_all(h, keys)
    values: list[object] = [*h.take_jobs(), LoadDone("r", 3), Progress((LoadDone("r", 1),))]
    values.append(TransferResult(1, False, 0, 0.0, "why"))
    assert any(isinstance(v, TransferJob) for v in values)
    for value in values:
        assert pickle.loads(pickle.dumps(value)) == value
        assert not hasattr(value, "__dict__"), f"{type(value).__name__} is not slotted"
        field = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)


def test_a_load_shorter_than_its_promotions_counts_each_loaded_block_once() -> None:
    """A request's CPU blocks can be evicted while its promotions run: the load is then
    shorter than what was promoted. Hits were counted as ``loaded - promoted`` for the
    CPU tier, a negative count here, and the engine's metrics crashed on it (``kvtier
    soak``: "Counters can only be incremented by non-negative amounts")."""
    h = half(cpu_blocks=4, disk_blocks=8)
    keys = pages(4)
    store_all(h, keys[2:], rid="tail")  # p2, p3 into the CPU tier, then to disk
    finish(h, h.take_jobs())
    store_all(h, pages(4, "q"), rid="q")  # evicts p2 and p3 from the CPU tier
    finish(h, h.take_jobs(write_through=False))
    store_all(h, keys[:2], rid="head")  # p0, p1 in the CPU tier
    assert [h.manager.holder(k).medium for k in keys] == ["CPU", "CPU", "DISK", "DISK"]  # type: ignore[union-attr]
    h.take_stats()
    assert h.num_external_hit_pages("r", keys, 0, 17) == 4
    h.start_load("r", keys, 0, [BlockId(i) for i in range(4)])
    promotions = h.take_jobs(write_through=False)
    assert [j.src.block_hashes for j in promotions] == [(keys[2], keys[3])]  # type: ignore[attr-defined]
    # Another request's store evicts p1, the coldest unpinned block, mid-promotion.
    h.pages_full("x", pages(1, "x"), 1, [BlockId(9)])
    (store,) = h.take_jobs(write_through=False)
    assert h.manager.primary.state(keys[1]) is None
    finish(h, [store, *promotions])
    (load,) = h.take_jobs(write_through=False)
    assert load.src == CPULoadStoreSpec((h.manager.primary.slot(keys[0]),))  # type: ignore[arg-type]
    assert finish(h, [load]).loads == (LoadDone("r", 1),)
    stats = h.take_stats()
    assert stats.hit_blocks == {Medium.CPU: 1}
    assert stats.loaded_blocks == 1


def test_a_request_aborted_mid_load_with_a_store_in_flight_is_released_after_both() -> None:
    """Its pages are written by the load and read by the store: the engine may reuse
    them only when both are done, whichever ends first."""
    for load_first in (True, False):
        h = half(cpu_blocks=8)
        keys = pages(4)
        store_all(h, keys[:2], rid="w")
        assert h.num_external_hit_pages("r", keys, 0, 17) == 2
        h.start_load("r", keys, 0, [BlockId(0), BlockId(1)])
        h.pages_full("r", keys, 4, [BlockId(i) for i in range(4)])
        load, store = h.take_jobs(write_through=False)
        assert (load.kind, store.kind) == (JobKind.LOAD, JobKind.STORE)
        assert h.request_finished("r"), "jobs still use its pages"
        first, second = (load, store) if load_first else (store, load)
        assert finish(h, [first]).released == ()
        assert finish(h, [second]).released == ("r",)
        assert h.take_jobs(write_through=False) == []
        assert not h.has_pending_work
