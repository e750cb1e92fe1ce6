"""The scheduler half's promises to any engine, checked without one.

vLLM does not clamp the connector's answers the way the reference engine does, so
these drive ``ConnectorScheduler`` alone and play the worker half with
``TransferResult`` values:

* the hit count: never past the page that holds the prompt's last token, always
  ending on an offloaded-block boundary, never past what is stored -- against a
  brute-force search over every possible end, for block_size_factor 1, 2 and 4;
* GPU prefix-cache hits count as uses for reuse-gated admission;
* a failed store or load leaves no work behind: no write-through of blocks that never
  became ready, an empty write-through queue, no skip counted, and later good blocks
  still all reach the secondary tier.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.connector.scheduler_half import ConnectorScheduler, LoadDone
from kvtier.jobs import JobKind, TransferJob, TransferResult
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.tiering import TieredManager
from tests.budget import examples

PAGE = 4


def pages(n: int, tag: str = "p") -> list[BlockHash]:
    return [BlockHash(f"{tag}{i}".encode()) for i in range(n)]


def half(
    cpu_blocks: int = 64,
    f: int = 1,
    disk_blocks: int = 0,
    store_policy: str = "eager",
    store_threshold: int = 0,
    max_pending_writes: int = 1024,
) -> ConnectorScheduler:
    cpu = CPUOffloadingManager(
        num_blocks=cpu_blocks, block_size=PAGE * f, store_threshold=store_threshold
    )
    secondaries = []
    if disk_blocks:
        disk_policy = make_policy("lru", disk_blocks)
        secondaries.append(
            TierManager(
                medium=Medium.DISK, num_blocks=disk_blocks, block_size=PAGE * f, policy=disk_policy
            )
        )
    return ConnectorScheduler(
        TieredManager(cpu, secondaries, max_pending_writes=max_pending_writes),
        block_size_factor=f,
        gpu_block_size=PAGE,
        store_policy=store_policy,
        discovery_wait_s=0.0,
    )


def finish(h: ConnectorScheduler, jobs: list[TransferJob], ok: bool = True) -> None:
    h.on_finished(TransferResult(j.job_id, ok, 100 if ok else 0, 0.0) for j in jobs)


def store(h: ConnectorScheduler, keys: list[BlockHash], rid: str, ok: bool = True) -> None:
    h.pages_full(rid, keys, len(keys), [BlockId(i) for i in range(len(keys))])
    jobs = h.take_jobs(write_through=False)
    assert all(j.kind is JobKind.STORE for j in jobs)
    finish(h, jobs, ok)


def best_end(g: int, stored_pages: int, num_tokens: int, f: int) -> int:
    """The furthest page a load from page ``g`` may end at, by trying every end."""
    last_token_page = (num_tokens - 1) // PAGE
    best = g
    for end in range(g + 1, stored_pages + 1):
        if end % f == 0 and end <= last_token_page:
            best = end
    return best


@settings(max_examples=examples(300), deadline=None)
@given(
    f=st.sampled_from([1, 2, 4]),
    stored_blocks=st.integers(0, 6),
    extra_pages=st.integers(0, 9),
    gpu_pages=st.integers(0, 40),
    tail_tokens=st.integers(0, PAGE - 1),
)
def test_hits_end_on_a_block_boundary_before_the_last_token(
    f: int, stored_blocks: int, extra_pages: int, gpu_pages: int, tail_tokens: int
) -> None:
    h = half(f=f)
    num_pages = stored_blocks * f + extra_pages
    keys = pages(num_pages)
    if stored_blocks:
        store(h, keys[: stored_blocks * f], "w")
    g = min(gpu_pages, num_pages)
    num_tokens = max(1, num_pages * PAGE + tail_tokens)
    hit = h.num_external_hit_pages("r", keys, g, num_tokens)
    assert hit is not None
    end = g + hit
    assert hit >= 0
    assert hit == 0 or end % f == 0, "a load ends on an offloaded-block boundary"
    assert hit == 0 or end <= (num_tokens - 1) // PAGE, "the last token is recomputed"
    assert end <= max(g, stored_blocks * f), "only stored pages are reported"
    assert end == best_end(g, stored_blocks * f, num_tokens, f)


def test_gpu_hits_count_as_uses_for_reuse_admission() -> None:
    """Seen once by a lookup, then served by the GPU prefix cache: stored on that
    second use. Without counting GPU hits, nothing would ever be stored here."""
    h = half(store_policy="reuse", store_threshold=2)
    keys = pages(6)
    assert h.num_external_hit_pages("a", keys, 0, 6 * PAGE + 1) == 0  # seen once
    store(h, keys, "a")
    assert h.take_stats().stored_blocks == 0
    assert h.manager.primary.stats().stores_skipped == 6
    h.request_finished("a")
    # The next request finds all six pages in the GPU prefix cache.
    assert h.num_external_hit_pages("b", keys, 6, 6 * PAGE + 1) == 0
    store(h, keys, "b")
    assert h.take_stats().stored_blocks == 6
    assert h.manager.lookup(keys) == 6


def test_a_failed_store_queues_no_write_through() -> None:
    h = half(cpu_blocks=16, disk_blocks=16, max_pending_writes=4)
    bad = pages(4, "bad")
    store(h, bad, "a", ok=False)
    assert h.take_stats().failed_stores == 4
    assert h.manager.pending_writes == 0, "dead keys in the write-through queue"
    assert h.take_jobs() == []
    good = pages(4, "good")
    store(h, good, "b")
    writes = h.take_jobs()
    assert [j.kind for j in writes] == [JobKind.WRITE]
    assert list(writes[0].dst.block_hashes) == good  # type: ignore[attr-defined]
    finish(h, writes)
    tiering = h.manager.stats()
    assert (tiering.writes, tiering.writes_skipped, tiering.write_failures) == (4, 0, 0)
    assert h.manager.pending_writes == 0
    assert not h.has_pending_work


def test_a_failed_write_through_is_not_retried_and_leaves_the_queue_empty() -> None:
    h = half(cpu_blocks=16, disk_blocks=16, max_pending_writes=4)
    keys = pages(4)
    store(h, keys, "a")
    writes = h.take_jobs()
    finish(h, writes, ok=False)
    tiering = h.manager.stats()
    assert (tiering.writes, tiering.write_failures, tiering.writes_skipped) == (0, 4, 0)
    assert h.manager.pending_writes == 0
    assert h.take_jobs() == []
    assert h.manager.primary.pins(keys[0]) == 0, "the CPU copy was unpinned"


def test_a_failed_load_emits_nothing_more_and_reports_no_pages() -> None:
    h = half(disk_blocks=16)
    keys = pages(4)
    store(h, keys, "w")
    finish(h, h.take_jobs())  # write-through to disk
    h.start_load("r", keys, 0, [BlockId(10 + i) for i in range(3)])
    (load,) = h.take_jobs(write_through=False)
    assert load.kind is JobKind.LOAD
    progress = h.on_finished([TransferResult(load.job_id, False, 0, 0.0, "boom")])
    assert progress.loads == (LoadDone("r", 0),)
    assert h.take_jobs() == []
    assert h.jobs_in_flight == []
    assert not h.has_pending_work
    stats = h.take_stats()
    assert (stats.failed_loads, stats.loaded_blocks, stats.hit_blocks) == (3, 0, {})


def test_a_failed_promotion_loads_nothing_and_drops_the_bad_copy() -> None:
    h = half(cpu_blocks=2, disk_blocks=8)
    keys = pages(2)
    store(h, keys, "w")
    finish(h, h.take_jobs())  # on disk now
    store(h, pages(2, "other"), "x")  # pushes both out of the 2-block CPU tier
    finish(h, h.take_jobs())
    assert h.manager.primary.lookup(keys) == 0
    h.start_load("r", keys, 0, [BlockId(20), BlockId(21)])
    (promotion,) = h.take_jobs(write_through=False)
    assert promotion.kind is JobKind.PROMOTE
    progress = h.on_finished([TransferResult(promotion.job_id, False, 0, 0.0, "bad crc")])
    assert progress.loads == (LoadDone("r", 0),)
    assert h.take_jobs() == [], "no load of blocks that never arrived"
    assert not h.has_pending_work
    stats = h.take_stats()
    assert (stats.failed_loads, stats.loaded_blocks, stats.hit_blocks) == (2, 0, {})
    assert stats.refused_loads == 0, "failed, not refused: each block counted once"
    assert h.manager.lookup(keys) == 0, "the unreadable disk copy is a miss from now on"
