"""Scheduler-half details a worker half sees: the exact GPU pages of a load job that
starts inside an offloaded block and ends early (written for a seeded bug that the
contract tests let through, issue 19)."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence

import pytest

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.connector.scheduler_half import ConnectorScheduler, LoadDone
from kvtier.jobs import JobKind, TransferResult
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.tiering import TieredManager

from .test_scheduler_half_contract import PAGE, half, pages, store


def test_a_load_cut_short_lists_only_the_pages_its_blocks_hold() -> None:
    # f = 2: offloaded block 0 is pages 0-1, block 1 pages 2-3. Only block 0 is stored.
    h = half(f=2)
    keys = pages(4)
    store(h, keys[:2], "w")
    # The engine asks for pages 1..3 (page 0 is a GPU hit): skip page 0 of block 0,
    # and block 1 is not there, so one page can come back.
    h.start_load("r", keys, 1, [BlockId(30), BlockId(31), BlockId(32)])
    (job,) = h.take_jobs(write_through=False)
    assert job.kind is JobKind.LOAD
    assert job.dst == GPULoadStoreSpec((BlockId(30),), skip_count=1)
    progress = h.on_finished([TransferResult(job.job_id, True, 2048, 0.0)])
    assert progress.loads == (LoadDone("r", 1),)
    stats = h.take_stats()
    assert (stats.loaded_blocks, stats.refused_loads) == (1, 1)


def test_jobs_are_numbered_from_zero_and_counters_add_up_over_a_window() -> None:
    h = half(disk_blocks=16)
    a, b = pages(2, "a"), pages(3, "b")
    h.pages_full("a", a, 2, [BlockId(0), BlockId(1)])
    h.pages_full("b", b, 3, [BlockId(2), BlockId(3), BlockId(4)])
    jobs = h.take_jobs(write_through=False)
    assert [(j.job_id, j.kind) for j in jobs] == [(0, JobKind.STORE), (1, JobKind.STORE)]
    assert [j.dst for j in jobs] == [
        CPULoadStoreSpec((BlockId(1), BlockId(0))),
        CPULoadStoreSpec((BlockId(4), BlockId(3), BlockId(2))),
    ]
    h.on_finished([TransferResult(0, True, 100, 0.0), TransferResult(1, True, 150, 0.0)])
    (write,) = h.take_jobs()
    assert write.job_id == 2 and write.kind is JobKind.WRITE
    assert write.src == CPULoadStoreSpec(tuple(BlockId(i) for i in (1, 0, 4, 3, 2)))
    assert isinstance(write.dst, DiskLoadStoreSpec) and write.dst.block_hashes == (*a, *b)
    h.on_finished([TransferResult(2, True, 500, 0.0)])
    h.start_load("x", a, 0, [BlockId(10)])
    h.start_load("y", b, 0, [BlockId(11), BlockId(12)])
    loads = h.take_jobs(write_through=False)
    assert [j.job_id for j in loads] == [3, 4]
    h.on_finished([TransferResult(3, True, 10, 0.0), TransferResult(4, True, 20, 0.0)])
    h.pages_full("c", pages(1, "c"), 1, [BlockId(7)])
    h.pages_full("d", pages(1, "d"), 1, [BlockId(8)])
    failed = h.take_jobs(write_through=False)
    h.on_finished([TransferResult(j.job_id, False, 0, 0.0) for j in failed])
    h.start_load("z", a, 0, [BlockId(13)])
    h.start_load("w", b, 0, [BlockId(14)])
    h.on_finished([TransferResult(j.job_id, False, 0, 0.0) for j in h.take_jobs(False)])
    s = h.take_stats()
    assert (s.stored_blocks, s.bytes_stored, s.failed_stores) == (5, 250, 2)
    assert (s.loaded_blocks, s.bytes_loaded, s.failed_loads) == (3, 30, 2)


def test_a_request_stores_each_block_once_as_its_pages_fill() -> None:
    # A tier of 2: the second store evicts the first blocks of the same request.
    h = half(cpu_blocks=2)
    keys = pages(4)
    table = [BlockId(20 + i) for i in range(4)]
    h.pages_full("r", keys, 2, table)
    (first,) = h.take_jobs(write_through=False)
    h.on_finished([TransferResult(first.job_id, True, 100, 0.0)])
    h.pages_full("r", keys, 2, table)
    assert h.take_jobs(write_through=False) == []
    h.pages_full("r", keys, 4, table)
    (second,) = h.take_jobs(write_through=False)
    assert second.src == GPULoadStoreSpec((BlockId(22), BlockId(23)))
    h.on_finished([TransferResult(second.job_id, True, 100, 0.0)])
    assert h.take_stats().refused_stores == 0
    assert h.request_finished("r") is False, "no store reads its pages any more"


def test_a_load_from_inside_a_later_block_skips_the_right_pages() -> None:
    h = half(f=2)
    keys = pages(6)
    store(h, keys, "w")
    h.start_load("r", keys, 3, [BlockId(40), BlockId(41), BlockId(42)])
    (job,) = h.take_jobs(write_through=False)
    assert job.dst == GPULoadStoreSpec((BlockId(40), BlockId(41), BlockId(42)), skip_count=1)
    assert job.src == CPULoadStoreSpec(
        (h.manager.primary.slot(keys[3]), h.manager.primary.slot(keys[5]))  # type: ignore[arg-type]
    )
    progress = h.on_finished([TransferResult(job.job_id, True, 100, 0.0)])
    assert progress.loads == (LoadDone("r", 3),)


def test_refused_loads_add_up_over_a_window() -> None:
    h = half(f=1)
    keys = pages(1)
    store(h, keys, "w")
    for rid in ("x", "y"):
        h.start_load(rid, [*keys, *pages(2, rid)], 0, [BlockId(1), BlockId(2), BlockId(3)])
    h.on_finished([TransferResult(j.job_id, True, 1, 0.0) for j in h.take_jobs(False)])
    assert h.take_stats().refused_loads == 4


class Gate:
    """A shared store holding ``held``, whose checks wait for ``release``."""

    outages = 0

    def __init__(self, held: list[BlockHash]) -> None:
        self.held = set(held)
        self.release = threading.Event()

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        self.release.wait(10)
        return [k in self.held for k in ks]


def shared_half(store: Gate, wait_s: float) -> ConnectorScheduler:
    remote = TierManager(
        medium=Medium.REMOTE, num_blocks=16, block_size=PAGE, policy=make_policy("lru", 16)
    )
    tiers = TieredManager(
        CPUOffloadingManager(num_blocks=16, block_size=PAGE),
        [remote],
        shared={Medium.REMOTE: store},
    )
    return ConnectorScheduler(
        tiers, block_size_factor=1, gpu_block_size=PAGE, discovery_wait_s=wait_s
    )


def test_admission_waits_for_a_shared_tier_then_counts_what_it_found() -> None:
    keys = pages(4)
    store = Gate(keys[:3])
    h = shared_half(store, wait_s=60.0)
    assert h.num_external_hit_pages("r", keys, 1, 17) is None, "the remote is being asked"
    assert h.num_external_hit_pages("r", keys, 1, 17) is None
    store.release.set()
    h.manager.wait_discoveries()
    hit = h.num_external_hit_pages("r", keys, 1, 17)
    assert hit == 2 and isinstance(hit, int), "pages 1 and 2 found on the remote"
    assert h.manager.primary.stats().lookups == 1, "asked once, then only re-read"
    # Answered: the next admission of the request looks up again (and asks the
    # remote about page 3 again: it may answer None while that check runs).
    assert h.num_external_hit_pages("r", keys, 1, 17) in (None, 2)
    assert h.manager.primary.stats().lookups == 2
    h.shutdown()


def test_admission_stops_waiting_after_discovery_wait_s() -> None:
    keys = pages(3)
    store = Gate(keys)
    h = shared_half(store, wait_s=0.05)
    assert h.num_external_hit_pages("r", keys, 0, 13) is None
    time.sleep(0.1)
    assert h.num_external_hit_pages("r", keys, 0, 13) == 0, "waited long enough: misses"
    store.release.set()
    h.shutdown()


def test_an_unknown_store_policy_is_named() -> None:
    with pytest.raises(ValueError, match=r"^store_policy must be one of .*'eager'.*got 'lazy'$"):
        half(store_policy="lazy")


def test_a_request_is_released_when_its_last_store_finishes() -> None:
    h = half()
    keys = pages(4)
    h.pages_full("r", keys, 2, [BlockId(0), BlockId(1)])
    h.pages_full("r", keys, 4, [BlockId(0), BlockId(1), BlockId(2), BlockId(3)])
    first, second = h.take_jobs(write_through=False)
    assert h.request_finished("r") is True
    assert h.on_finished([TransferResult(first.job_id, True, 1, 0.0)]).released == ()
    assert h.on_finished([TransferResult(second.job_id, True, 1, 0.0)]).released == ("r",)
    assert h.request_finished("never-seen") is False


def test_a_single_block_on_disk_is_promoted_into_its_cpu_slot_then_loaded() -> None:
    h = half(cpu_blocks=1, disk_blocks=8)
    keys = pages(1)
    store(h, keys, "w")
    h.on_finished([TransferResult(j.job_id, True, 1, 0.0) for j in h.take_jobs()])
    store(h, pages(1, "other"), "x")  # pushes it out of the one-block CPU tier
    h.on_finished([TransferResult(j.job_id, True, 1, 0.0) for j in h.take_jobs()])
    h.start_load("r", keys, 0, [BlockId(5)])
    (promotion,) = h.take_jobs(write_through=False)
    assert promotion.kind is JobKind.PROMOTE
    assert isinstance(promotion.src, DiskLoadStoreSpec) and promotion.src.block_hashes == (keys[0],)
    assert promotion.dst == CPULoadStoreSpec((h.manager.primary.slot(keys[0]),))  # type: ignore[arg-type]
    h.on_finished([TransferResult(promotion.job_id, True, 1, 0.0)])
    (load,) = h.take_jobs(write_through=False)
    assert load.kind is JobKind.LOAD and load.src == promotion.dst
    assert h.on_finished([TransferResult(load.job_id, True, 1, 0.0)]).loads == (LoadDone("r", 1),)


def test_the_policies_see_the_whole_request_before_its_use_when_the_gpu_served_its_head() -> None:
    # What ``replay`` gives a policy that learns (``density``, ``leader``): the request's
    # whole prefix, then the touch. Before, the connector touched first (a learning
    # policy measured every hit's age as ~0) and showed only the keys past the GPU hit.
    log: list[tuple[str, str, list[BlockHash]]] = []

    class Recording(LRUPolicy):
        def __init__(self, capacity: int, tier: str) -> None:
            super().__init__(capacity)
            self.tier = tier

        def observe(self, keys: Sequence[BlockHash]) -> None:
            log.append(("observe", self.tier, list(keys)))

        def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
            log.append(("touch", self.tier, sorted(keys)))
            super().touch_all(keys, storing)

    def tier(medium: Medium, name: str) -> TierManager:
        return TierManager(
            medium=medium, num_blocks=16, block_size=PAGE, policy=Recording(16, name)
        )

    cpu = tier(Medium.CPU, "cpu")
    h = ConnectorScheduler(
        TieredManager(cpu, [tier(Medium.DISK, "disk")]),
        block_size_factor=1,
        gpu_block_size=PAGE,
        discovery_wait_s=0.0,
    )
    keys = pages(6)
    store(h, keys[:4], "w")
    log.clear()
    # pages 0-1 served by the GPU, 2-3 offloaded: two to load
    assert h.num_external_hit_pages("r", keys, 2, 6 * PAGE) == 2
    assert log[:2] == [("observe", "cpu", keys), ("observe", "disk", keys)]
    assert log[2:] == [("touch", "cpu", sorted(keys[:4]))]
    stats = cpu.stats()
    assert (stats.lookups, stats.lookup_blocks, stats.hit_blocks) == (1, 4, 2)
