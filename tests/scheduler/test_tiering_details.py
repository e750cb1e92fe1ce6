"""TieredManager details a caller sees: exact counters, the keys a write job tells the
worker to delete, the queue's bound per tier, and the heads ``can_store`` and
``can_promote`` answer (written for the survivors of mutation testing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from kvtier.blocks import Medium
from kvtier.errors import ConfigError, ProtocolError
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, RemoteLoadStoreSpec
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.protocol import OffloadingEvent
from kvtier.scheduler.tiering import TieredManager, TieringStats
from kvtier.sim.replay import replay
from kvtier.sim.workload import generate, shaped

from .conftest import keys


def tier(medium: Medium, n: int, *, events: bool = False) -> TierManager:
    return TierManager(
        medium=medium,
        num_blocks=n,
        block_size=16,
        policy=make_policy("lru", n),
        enable_events=events,
    )


def tiered(
    cpu: int = 4, disk: int = 4, queue: int = 16, remote: int | None = None
) -> TieredManager:
    secondaries = [tier(Medium.DISK, disk)]
    if remote is not None:
        secondaries.append(tier(Medium.REMOTE, remote))
    return TieredManager(
        CPUOffloadingManager(num_blocks=cpu, block_size=16),
        secondaries,
        max_pending_writes=queue,
    )


def store(t: TieredManager, ks: list[bytes]) -> None:
    out = t.prepare_store(ks)
    assert out is not None
    t.complete_store(out.block_hashes_to_store)


def stats(t: TieredManager) -> tuple[int, int, int, int, int]:
    s = t.stats()
    return (s.promotions, s.promotion_failures, s.writes, s.write_failures, s.writes_skipped)


def test_a_fresh_tiering_counts_nothing() -> None:
    t = tiered(remote=4)
    assert t.stats() == TieringStats(
        hit_blocks={Medium.CPU: 0, Medium.DISK: 0, Medium.REMOTE: 0},
        promotions=0,
        promotion_failures=0,
        writes=0,
        write_failures=0,
        writes_skipped=0,
    )
    assert t.block_size == 16 and t.pending_writes == 0 and not t.has_pending_work


def test_the_queue_bound_must_be_at_least_one() -> None:
    TieredManager(CPUOffloadingManager(num_blocks=2, block_size=16), [], max_pending_writes=1)
    with pytest.raises(
        ConfigError, match=r"^config key 'max_pending_writes': must be >= 1, got 0$"
    ):
        TieredManager(CPUOffloadingManager(num_blocks=2, block_size=16), [], max_pending_writes=0)


def test_the_queue_holds_1024_blocks_per_tier_by_default() -> None:
    t = TieredManager(
        CPUOffloadingManager(num_blocks=1100, block_size=16), [tier(Medium.DISK, 1100)]
    )
    store(t, keys(*range(1025)))
    assert (t.pending_writes, t.stats().writes_skipped) == (1024, 1)


def test_writes_and_their_failures_are_counted_per_block() -> None:
    t = tiered()
    store(t, keys(1, 2, 3))
    assert t.pending_writes == 3 and t.has_pending_work
    (job,) = t.prepare_writes()
    assert job.block_hashes == tuple(keys(1, 2, 3))
    assert isinstance(job.src, CPULoadStoreSpec) and isinstance(job.dst, DiskLoadStoreSpec)
    assert t.pending_writes == 0 and not t.has_pending_work
    t.complete_write(job, success=True)
    assert stats(t) == (0, 0, 3, 0, 0)
    store(t, keys(4))
    (job,) = t.prepare_writes()
    t.complete_write(job, success=False)
    assert stats(t) == (0, 0, 3, 1, 0)
    assert t.secondaries[0].state(keys(4)[0]) is None
    assert t.primary.pins(keys(4)[0]) == 0


def test_prepare_writes_hands_out_at_most_max_blocks_per_tier_in_queue_order() -> None:
    t = tiered(cpu=8, disk=8, remote=8)
    store(t, keys(1, 2, 3))
    jobs = t.prepare_writes(max_blocks=2)
    assert [(j.dst.medium, j.block_hashes) for j in jobs] == [
        (Medium.DISK, tuple(keys(1, 2))),
        (Medium.REMOTE, tuple(keys(1, 2))),
    ]
    assert t.pending_writes == 2  # k3 once per tier
    jobs += t.prepare_writes(max_blocks=2)
    assert [j.block_hashes for j in jobs[2:]] == [tuple(keys(3)), tuple(keys(3))]
    assert t.prepare_writes() == []


def test_a_full_queue_skips_and_counts_each_block_for_each_tier() -> None:
    t = tiered(cpu=8, disk=8, remote=8, queue=2)
    store(t, keys(1, 2, 3))
    assert t.pending_writes == 4  # two per tier
    assert stats(t) == (0, 0, 0, 0, 2)  # k3, once for disk and once for remote
    store(t, keys(4))
    assert stats(t) == (0, 0, 0, 0, 4)
    jobs = t.prepare_writes()
    assert [j.block_hashes for j in jobs] == [tuple(keys(1, 2))] * 2


def test_a_queue_of_one_takes_exactly_one_block() -> None:
    t = tiered(queue=1)
    store(t, keys(1, 2))
    assert (t.pending_writes, t.stats().writes_skipped) == (1, 1)


def test_blocks_a_secondary_already_holds_are_not_queued_for_it() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1))
    (job,) = t.prepare_writes()
    t.complete_write(job, success=True)
    # k1 leaves the CPU tier, is promoted back, and becomes READY in CPU again.
    store(t, keys(2, 3))
    assert t.primary.state(keys(1)[0]) is None
    jobs = t.prepare_promotion(keys(1))
    assert jobs is not None
    (promo,) = jobs
    t.complete_promotion(promo, success=True)
    assert t.pending_writes == 2, "k2 and k3 queued, not k1: the disk holds it"
    assert stats(t) == (1, 0, 1, 0, 0)


def test_a_secondary_that_cannot_make_room_skips_the_write_and_counts_it() -> None:
    t = tiered(cpu=4, disk=2)
    store(t, keys(1, 2))
    jobs = t.prepare_writes()  # the disk's two slots are STORING now
    store(t, keys(3))
    assert t.prepare_writes() == []
    assert stats(t) == (0, 0, 0, 0, 1)
    assert t.pending_writes == 0
    for job in jobs:
        t.complete_write(job, success=True)


def test_a_write_names_the_keys_its_disk_evicted_for_it() -> None:
    t = tiered(cpu=4, disk=2)
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        assert job.dst == DiskLoadStoreSpec(
            job.dst.block_ids, block_hashes=tuple(keys(1, 2)), evicted_hashes=()
        )
        t.complete_write(job, success=True)
    store(t, keys(3))
    (job,) = t.prepare_writes()
    assert isinstance(job.dst, DiskLoadStoreSpec)
    assert job.dst.block_hashes == tuple(keys(3))
    assert job.dst.evicted_hashes == tuple(keys(1)), "the disk's LRU block makes room"
    t.complete_write(job, success=True)


def test_a_failed_promotion_drop_is_deleted_by_the_next_write() -> None:
    t = tiered(cpu=2, disk=8)
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(3, 4))  # evicts k1, k2 from CPU; queued for disk
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    jobs = t.prepare_promotion(keys(1))
    assert jobs is not None
    (promo,) = jobs
    t.complete_promotion(promo, success=False)
    assert stats(t) == (0, 1, 4, 0, 0)
    assert t.secondaries[0].state(keys(1)[0]) is None, "the bad copy is dropped"
    store(t, keys(5))
    (job,) = t.prepare_writes()
    assert isinstance(job.dst, DiskLoadStoreSpec)
    assert job.dst.evicted_hashes == tuple(keys(1)), "the worker deletes the bad file"
    t.complete_write(job, success=True)
    store(t, keys(6))
    (job,) = t.prepare_writes()
    assert isinstance(job.dst, DiskLoadStoreSpec)
    assert job.dst.evicted_hashes == (), "told once"


def test_a_dropped_key_stored_again_is_not_deleted() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(3, 4))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    (promo,) = t.prepare_promotion(keys(1)) or []
    t.complete_promotion(promo, success=False)
    store(t, keys(1))  # recomputed and stored again: its write brings it back to disk
    (job,) = t.prepare_writes()
    assert job.block_hashes == tuple(keys(1))
    assert isinstance(job.dst, DiskLoadStoreSpec) and job.dst.evicted_hashes == ()


class Shared:
    outages = 0

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        return [False] * len(ks)


def test_a_write_to_a_shared_tier_deletes_nothing() -> None:
    primary = CPUOffloadingManager(num_blocks=4, block_size=16)
    remote = tier(Medium.REMOTE, 1)
    t = TieredManager(primary, [remote], shared={Medium.REMOTE: Shared()})
    store(t, keys(1))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(2))
    (job,) = t.prepare_writes()
    assert isinstance(job.dst, RemoteLoadStoreSpec)
    assert remote.state(keys(1)[0]) is None, "evicted from the index"
    assert job.dst.evicted_hashes == (), "another engine may still use it"
    t.shutdown()


def test_promotion_counts_blocks_and_unpins_the_secondary() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(3, 4))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    disk = t.secondaries[0]
    jobs = t.prepare_promotion(keys(1, 2))
    assert jobs is not None
    (promo,) = jobs
    assert promo.block_hashes == tuple(keys(1, 2))
    assert disk.pins(keys(1)[0]) == 1 and disk.pins(keys(2)[0]) == 1
    assert t.primary.state(keys(1)[0]) is BlockState.STORING
    t.complete_promotion(promo, success=True)
    assert disk.pins(keys(1)[0]) == 0
    assert t.primary.state(keys(2)[0]) is BlockState.READY
    assert stats(t) == (2, 0, 4, 0, 0)


def test_promotion_skips_keys_ready_in_the_primary_and_refuses_unknown_ones() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    assert t.prepare_promotion(keys(1, 2)) == []
    assert t.can_promote(keys(1, 2)) == 2
    assert t.prepare_promotion(keys(1, 9)) is None
    assert t.can_promote(keys(1, 9, 2)) == 1
    assert t.can_promote([]) == 0
    assert t.prepare_promotion([]) == []


def test_promotion_refuses_a_key_still_being_stored_into_the_primary() -> None:
    t = tiered(cpu=4, disk=4)
    store(t, keys(1))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    # k2 on disk only, k3 STORING in the primary.
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(2))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    out = t.prepare_store(keys(3))
    assert out is not None
    assert t.can_promote(keys(1, 2, 3)) == 2
    assert t.prepare_promotion(keys(2, 3)) is None
    assert t.primary.state(keys(2)[0]) is None, "nothing changed"
    assert t.can_promote(keys(3)) == 0


def test_promotion_plans_one_job_per_tier_in_tier_order() -> None:
    t = tiered(cpu=4, disk=4, remote=4)
    disk, remote = t.secondaries
    for secondary, ks in ((remote, keys(1)), (disk, keys(2)), (remote, keys(3))):
        out = secondary.prepare_store(ks)
        assert out is not None
        secondary.complete_store(out.block_hashes_to_store)
    assert t.lookup(keys(1, 2, 3)) == 3
    assert t.stats().hit_blocks == {Medium.CPU: 0, Medium.DISK: 1, Medium.REMOTE: 2}
    jobs = t.prepare_promotion(keys(1, 2, 3))
    assert jobs is not None
    assert [(j.src.medium, j.block_hashes) for j in jobs] == [
        (Medium.DISK, tuple(keys(2))),
        (Medium.REMOTE, tuple(keys(1, 3))),
    ]
    slots = {k: t.primary.slot(k) for k in keys(1, 2, 3)}
    for job in jobs:
        assert isinstance(job.dst, CPULoadStoreSpec)
        assert list(job.dst.block_ids) == [slots[k] for k in job.block_hashes]
    for job in jobs:
        t.complete_promotion(job, success=True)
    assert t.stats().promotions == 3
    assert t.ready_run(keys(1, 2, 3, 4)) == 3


def test_promotion_that_cannot_make_room_changes_nothing() -> None:
    t = tiered(cpu=2, disk=4)
    assert t.prepare_store(keys(1, 2, 3, 4)) is None, "four blocks into two slots"
    assert len(t.primary) == 0
    store(t, keys(1, 2))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(3, 4))
    load = t.prepare_load(keys(3, 4))  # pinned: the CPU cannot make room
    assert load.medium is Medium.CPU
    assert t.can_promote(keys(1)) == 0
    assert t.prepare_promotion(keys(1)) is None
    assert t.primary.state(keys(1)[0]) is None and t.secondaries[0].pins(keys(1)[0]) == 0
    t.complete_load(keys(3, 4))
    assert t.can_promote(keys(1, 2)) == 2


def test_can_store_counts_keys_held_in_secondaries_as_taken() -> None:
    t = tiered(cpu=2, disk=4)
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(1, 2))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    # k1, k2 are on disk: prepare_store leaves them out; two CPU slots fit k3, k4.
    assert t.can_store(keys(1, 3, 2, 4, 5)) == 4
    assert t.can_store(keys(1, 2)) == 2
    out2 = t.prepare_store(keys(1, 3, 2, 4))
    assert out2 is not None and out2.block_hashes_to_store == tuple(keys(3, 4))


def test_can_store_without_secondaries_is_the_primary_answer() -> None:
    t = TieredManager(CPUOffloadingManager(num_blocks=2, block_size=16), [])
    assert t.can_store(keys(1, 2, 3)) == 2
    assert t.prepare_writes() == []


def test_events_come_from_every_tier_primary_first() -> None:
    primary = CPUOffloadingManager(num_blocks=1, block_size=16, enable_events=True)
    disk = tier(Medium.DISK, 4, events=True)
    t = TieredManager(primary, [disk])
    store(t, keys(1))
    for job in t.prepare_writes():
        t.complete_write(job, success=True)
    store(t, keys(2))
    assert list(t.take_events()) == [
        OffloadingEvent(tuple(keys(1)), 16, Medium.CPU, removed=False),
        OffloadingEvent(tuple(keys(1)), 16, Medium.CPU, removed=True),
        OffloadingEvent(tuple(keys(2)), 16, Medium.CPU, removed=False),
        OffloadingEvent(tuple(keys(1)), 16, Medium.DISK, removed=False),
    ]
    assert list(t.take_events()) == []


def test_touch_reaches_every_tier() -> None:
    t = tiered(cpu=4, disk=2)
    disk = t.secondaries[0]
    for ks in (keys(1), keys(2)):
        out = disk.prepare_store(ks)
        assert out is not None
        disk.complete_store(out.block_hashes_to_store)
    t.touch(keys(1))  # k2 is the disk's LRU block now
    out = disk.prepare_store(keys(3))
    assert out is not None and out.block_hashes_evicted == tuple(keys(2))


def test_lookup_known_counts_nothing_and_a_failed_complete_names_no_tier() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1))
    assert t.lookup_known(keys(1, 2)) == 1
    assert t.lookup_known([]) == 0
    assert t.primary.stats().lookups == 0
    assert t.stats().hit_blocks[Medium.CPU] == 0
    assert not t.discovering(keys(1)) and not t.discovering([])
    (job,) = t.prepare_writes()
    with pytest.raises(ProtocolError, match="no secondary tier of medium"):
        t.complete_promotion(type(job)(job.block_hashes, job.src, job.src), success=True)


def test_a_promotion_head_stops_at_the_first_key_the_primary_would_not_admit() -> None:
    primary = CPUOffloadingManager(num_blocks=4, block_size=16, store_threshold=2)
    t = TieredManager(primary, [tier(Medium.DISK, 4)])
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(1, 2, 3))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    primary.count_seen(keys(1, 3))
    primary.count_seen(keys(1, 3))
    # k2 was never reused: admission would skip it, and a promotion needs every key.
    assert t.can_promote(keys(1, 2, 3)) == 1
    jobs = t.prepare_promotion(keys(1))
    assert jobs is not None and [j.block_hashes for j in jobs] == [tuple(keys(1))]


def test_a_promotion_refused_by_admission_changes_nothing() -> None:
    primary = CPUOffloadingManager(num_blocks=4, block_size=16, store_threshold=2)
    t = TieredManager(primary, [tier(Medium.DISK, 4)])
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(1, 2))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    primary.count_seen(keys(1))
    primary.count_seen(keys(1))
    before = primary.stats()
    assert t.prepare_promotion(keys(1, 2)) is None
    assert primary.stats() == before
    assert t.prepare_promotion(keys(1)) is not None, "k1 was reused twice"


def test_a_promotion_refused_by_admission_leaves_no_block_in_the_primary() -> None:
    primary = CPUOffloadingManager(num_blocks=4, block_size=16, store_threshold=2)
    t = TieredManager(primary, [tier(Medium.DISK, 4)])
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(1, 2))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    primary.count_seen(keys(1))
    primary.count_seen(keys(1))
    assert t.prepare_promotion(keys(1, 2)) is None
    assert len(primary) == 0 and primary.num_free == 4, "k1's slot given back"
    assert disk.pins(keys(1)[0]) == 0 and disk.pins(keys(2)[0]) == 0


def test_a_promotion_of_a_block_already_being_promoted_is_refused_changing_nothing() -> None:
    t = tiered(cpu=4, disk=4)
    disk = t.secondaries[0]
    out = disk.prepare_store(keys(1, 2))
    assert out is not None
    disk.complete_store(out.block_hashes_to_store)
    (first,) = t.prepare_promotion(keys(1)) or []
    before = t.primary.stats()
    assert t.can_promote(keys(1, 2)) == 0
    assert t.prepare_promotion(keys(1, 2)) is None
    assert t.primary.stats() == before
    assert t.primary.state(keys(2)[0]) is None and disk.pins(keys(2)[0]) == 0
    t.complete_promotion(first, success=True)
    assert t.can_promote(keys(1, 2)) == 2


def put(t: TierManager, ks: list[bytes]) -> None:
    out = t.prepare_store(ks)
    assert out is not None
    t.complete_store(out.block_hashes_to_store)


def test_a_block_a_secondary_got_meanwhile_is_written_only_to_the_others() -> None:
    # Another engine wrote k1 to the disk while this one computed it.
    t = tiered(cpu=4, disk=4, remote=4)
    disk, remote = t.secondaries
    out = t.prepare_store(keys(1, 2))
    assert out is not None
    put(disk, keys(1))
    t.complete_store(keys(1, 2))
    assert t.pending_writes == 3, "k2 for both tiers, k1 for the remote only"
    jobs = t.prepare_writes()
    assert [(j.dst.medium, j.block_hashes) for j in jobs] == [
        (Medium.DISK, tuple(keys(2))),
        (Medium.REMOTE, tuple(keys(1, 2))),
    ]
    for job in jobs:
        t.complete_write(job, success=True)
    out = t.prepare_store(keys(3))
    assert out is not None
    put(disk, keys(3))
    t.complete_store(keys(3))
    (job,) = t.prepare_writes()  # nothing for the disk: the remote's job still comes
    assert (job.dst.medium, job.block_hashes) == (Medium.REMOTE, tuple(keys(3)))
    assert remote.state(keys(3)[0]) is BlockState.STORING


def test_a_tier_without_room_does_not_stop_the_writes_to_the_next() -> None:
    t = tiered(cpu=8, disk=1, remote=8)
    disk = t.secondaries[0]
    put(disk, keys(9))
    disk.prepare_load(keys(9))  # the disk's one slot is held
    store(t, keys(1))
    (job,) = t.prepare_writes()
    assert (job.dst.medium, job.block_hashes) == (Medium.REMOTE, tuple(keys(1)))
    store(t, keys(2))
    t.prepare_writes()
    assert t.stats().writes_skipped == 2, "one block skipped for the disk, twice"


def test_a_failed_store_through_the_tiering_leaves_nothing_behind() -> None:
    t = tiered()
    out = t.prepare_store(keys(1))
    assert out is not None
    t.complete_store(keys(1), success=False)
    assert t.primary.state(keys(1)[0]) is None and t.primary.num_free == 4
    assert t.pending_writes == 0


class Held:
    """A shared store holding ``held``; ``outages`` moves when it restarts."""

    def __init__(self, held: Sequence[bytes]) -> None:
        self.held = set(held)
        self.outages = 0

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        return [k in self.held for k in ks]


def discovered(t: TieredManager, ks: list[bytes]) -> int:
    t.lookup(ks)
    t.wait_discoveries()
    return t.lookup(ks)


def test_discovery_behind_a_private_tier_is_adopted() -> None:
    store = Held(keys(1, 2))
    t = TieredManager(
        CPUOffloadingManager(num_blocks=4, block_size=16),
        [tier(Medium.DISK, 4), tier(Medium.REMOTE, 4)],
        shared={Medium.REMOTE: store},
    )
    assert discovered(t, keys(1, 2, 3)) == 2
    assert t.stats().hit_blocks == {Medium.CPU: 0, Medium.DISK: 0, Medium.REMOTE: 2}
    t.shutdown()


def test_discovery_works_again_after_an_outage() -> None:
    store = Held(keys(1, 2))
    t = TieredManager(
        CPUOffloadingManager(num_blocks=4, block_size=16),
        [tier(Medium.REMOTE, 4)],
        shared={Medium.REMOTE: store},
    )
    assert discovered(t, keys(1, 2)) == 2
    store.outages += 1
    store.held = set(keys(1))
    assert t.lookup(keys(1, 2)) == 0, "forgotten"
    t.wait_discoveries()
    assert t.lookup(keys(1, 2)) == 1, "asked again after the outage, and adopted"
    assert t.lookup(keys(1, 2)) == 1
    assert len(t.secondaries[0]) == 1, "not forgotten twice"
    t.shutdown()


def test_every_tier_s_policy_is_shown_each_lookup() -> None:
    """A policy that learns from lookups (``density``, ``leader``) on a secondary tier
    sees every request: it used to see none (only the primary's ``lookup`` showed it
    its policy), so a learning disk tier ordered its blocks as LRU does."""
    seen: dict[Medium, list[list[bytes]]] = {Medium.DISK: [], Medium.REMOTE: []}
    t = tiered(remote=4)
    for secondary in t.secondaries:
        secondary.policy.observe = lambda ks, m=secondary.medium: seen[m].append(list(ks))  # type: ignore[method-assign]
    ks = keys(3)
    t.lookup(ks)
    t.lookup(ks[:1])
    assert seen == {Medium.DISK: [ks, ks[:1]], Medium.REMOTE: [ks, ks[:1]]}


def test_a_learning_disk_tier_learns_in_a_tiered_replay() -> None:
    """``density`` behind a CPU tier of a quarter of the disk's capacity, on a small
    generated chat trace (exact: deterministic). Before every tier's policy was shown
    the lookups, its disk tier never learned and served exactly LRU's 11,075."""
    trace = generate(replace(shaped("chat", 2), requests=1500))
    disk = round(0.10 * trace.num_distinct_blocks)
    hits = {
        p: replay(trace, disk // 4, p, disk_capacity_blocks=disk).ratios.hit_blocks
        for p in ("lru", "density")
    }
    assert (disk, hits) == (386, {"lru": 11075, "density": 11994})
