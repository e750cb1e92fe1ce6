"""Scheduler-half details a worker half sees: the exact GPU pages of a load job that
starts inside an offloaded block and ends early (written for a seeded bug that the
contract tests let through, issue 19)."""

from __future__ import annotations

from kvtier.blocks import BlockId
from kvtier.connector.scheduler_half import LoadDone
from kvtier.jobs import JobKind, TransferResult
from kvtier.load_store_specs import GPULoadStoreSpec

from .test_scheduler_half_contract import half, pages, store


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
