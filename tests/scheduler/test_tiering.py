"""TieredManager: lookup across tiers, write-through, promotion, bounds, events."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvtier.blocks import Medium
from kvtier.errors import TransferError
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.tiering import TieredManager
from kvtier.specs import CPULoadStoreSpec, DiskLoadStoreSpec

from .conftest import keys


def tiered(cpu: int = 2, disk: int = 4, queue: int = 16) -> TieredManager:
    primary = CPUOffloadingManager(num_blocks=cpu, block_size=16, enable_events=True)
    disk_tier = TierManager(
        medium=Medium.DISK,
        num_blocks=disk,
        block_size=16,
        policy=make_policy("lru", disk),
        enable_events=True,
    )
    return TieredManager(primary, [disk_tier], max_pending_writes=queue)


def store(t: TieredManager, ks: list[bytes]) -> None:
    out = t.prepare_store(ks)
    assert out is not None
    t.complete_store(out.block_hashes_to_store)


def write_through(t: TieredManager) -> None:
    for job in t.prepare_writes():
        assert isinstance(job.src, CPULoadStoreSpec) and isinstance(job.dst, DiskLoadStoreSpec)
        assert job.dst.block_hashes == job.block_hashes
        t.complete_write(job, success=True)


def test_ready_blocks_are_written_through_and_stay_after_cpu_eviction() -> None:
    t = tiered()
    store(t, keys(1, 2))
    assert t.pending_writes == 2
    jobs = t.prepare_writes()
    assert [j.block_hashes for j in jobs] == [tuple(keys(1, 2))]
    assert t.primary.pins(keys(1)[0]) == 1, "the CPU copy is pinned while it is written"
    t.complete_write(jobs[0], success=True)
    assert t.primary.pins(keys(1)[0]) == 0
    store(t, keys(3, 4))  # evicts 1 and 2 from CPU
    assert keys(1)[0] not in t.primary
    assert t.lookup(keys(1, 2, 3, 9)) == 3, "1 and 2 on disk, 3 in CPU"
    assert t.lookup(keys(3, 4)) == 2
    assert t.stats().hit_blocks == {Medium.CPU: 3, Medium.DISK: 2}


def test_lookup_runs_across_tiers() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    write_through(t)
    store(t, keys(3, 4))
    write_through(t)
    # CPU holds 3, 4; disk holds 1, 2, 3, 4
    assert t.lookup(keys(1, 2, 3, 4, 5)) == 4


def test_promotion_makes_disk_blocks_ready_in_cpu() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    write_through(t)
    store(t, keys(3, 4))
    jobs = t.prepare_promotion(keys(1, 2))
    assert jobs is not None and len(jobs) == 1
    job = jobs[0]
    assert isinstance(job.src, DiskLoadStoreSpec) and isinstance(job.dst, CPULoadStoreSpec)
    assert t.secondaries[0].pins(keys(1)[0]) == 1
    assert t.lookup(keys(1)) == 1, "still servable from disk while promoting"
    t.complete_promotion(job, success=True)
    assert t.primary.lookup(keys(1, 2)) == 2
    assert isinstance(job.dst, CPULoadStoreSpec)
    assert list(job.dst.block_ids) == [t.primary.slot(k) for k in keys(1, 2)]
    assert t.secondaries[0].pins(keys(1)[0]) == 0
    spec = t.prepare_load(keys(1, 2))
    assert len(spec.block_ids) == 2  # type: ignore[attr-defined]
    t.complete_load(keys(1, 2))
    assert t.stats().promotions == 2


def test_failed_promotion_drops_the_block_from_both_tiers() -> None:
    # The disk could not deliver it (bad checksum, file gone): counting it as a hit
    # again would only fail again. It is a miss from now on, and is recomputed.
    t = tiered(cpu=2, disk=4)
    store(t, keys(1))
    write_through(t)
    store(t, keys(2, 3))
    jobs = t.prepare_promotion(keys(1))
    assert jobs
    t.complete_promotion(jobs[0], success=False)
    assert keys(1)[0] not in t.primary
    assert keys(1)[0] not in t.secondaries[0]
    assert t.lookup(keys(1)) == 0
    assert t.stats().promotion_failures == 1


def test_promotion_refused_when_cpu_cannot_make_room() -> None:
    t = tiered(cpu=2, disk=4)
    store(t, keys(1))
    write_through(t)
    store(t, keys(2, 3))
    t.prepare_load(keys(2, 3))  # CPU all pinned
    before = (len(t.primary), t.secondaries[0].pins(keys(1)[0]))
    assert t.prepare_promotion(keys(1)) is None
    assert (len(t.primary), t.secondaries[0].pins(keys(1)[0])) == before
    assert t.prepare_promotion(keys(7)) is None, "a key in no tier"


def test_write_queue_is_bounded_and_counts_skips() -> None:
    t = tiered(cpu=8, disk=8, queue=3)
    store(t, keys(1, 2, 3, 4, 5))
    assert t.pending_writes == 3
    assert t.stats().writes_skipped == 2


def test_failed_write_drops_the_disk_copy_only() -> None:
    t = tiered()
    store(t, keys(1))
    (job,) = t.prepare_writes()
    t.complete_write(job, success=False)
    assert keys(1)[0] not in t.secondaries[0]
    assert t.primary.lookup(keys(1)) == 1
    assert t.stats().write_failures == 1


def test_blocks_evicted_from_cpu_before_their_write_are_dropped_from_the_queue() -> None:
    t = tiered(cpu=2)
    store(t, keys(1, 2))
    store(t, keys(3, 4))  # 1, 2 evicted before write-through ran
    jobs = t.prepare_writes()
    assert [j.block_hashes for j in jobs] == [tuple(keys(3, 4))]


def test_events_name_their_medium() -> None:
    t = tiered(cpu=2, disk=2)
    store(t, keys(1, 2))
    write_through(t)
    store(t, keys(3, 4))
    write_through(t)
    media = {(e.medium, e.removed) for e in t.take_events()}
    assert media == {
        (Medium.CPU, False),
        (Medium.CPU, True),
        (Medium.DISK, False),
        (Medium.DISK, True),
    }


def test_queue_bound_is_validated() -> None:
    with pytest.raises(Exception, match="max_pending_writes"):
        tiered(queue=0)


def test_blocks_held_on_disk_are_not_stored_into_cpu_again() -> None:
    # An eager engine stores a block again once the CPU tier evicted it; with the
    # block still on disk that copy is wasted: it is promoted when it is needed.
    t = tiered(cpu=2, disk=4)
    store(t, keys(1, 2))
    write_through(t)
    store(t, keys(3, 4))  # 1 and 2 leave the CPU tier, stay on disk
    out = t.prepare_store(keys(1, 2, 5))
    assert out is not None and out.block_hashes_to_store == tuple(keys(5))


class FakeShared:
    """A shared store: holds some keys; ``outages`` moves when it goes down."""

    def __init__(self, held: set[bytes]) -> None:
        self.held = held
        self.outages = 0
        self.down = False

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        if self.down:
            raise TransferError("store is down")
        return [k in self.held for k in ks]


def shared_tiered(store: FakeShared) -> TieredManager:
    primary = CPUOffloadingManager(num_blocks=4, block_size=16)
    remote = TierManager(
        medium=Medium.REMOTE, num_blocks=8, block_size=16, policy=make_policy("lru", 8)
    )
    return TieredManager(primary, [remote], shared={Medium.REMOTE: store})


def lookup_after_discovery(t: TieredManager, ks: list[bytes]) -> int:
    """``lookup`` that starts the background checks, then the one that adopts them."""
    first = t.lookup(ks)
    t.wait_discoveries()
    assert t.lookup_known(ks) >= first
    return t.lookup(ks)


def test_blocks_other_engines_wrote_are_discovered_in_the_background() -> None:
    store = FakeShared(set(keys(1, 2)))
    t = shared_tiered(store)
    assert t.lookup(keys(1, 2, 3)) == 0, "the first lookup never waits for the network"
    assert t.discovering(keys(1, 2, 3))
    t.wait_discoveries()
    assert t.lookup_known(keys(1, 2, 3)) == 2  # adopted, nothing counted
    assert not t.discovering(keys(1, 2, 3))
    assert t.secondaries[0].state(keys(1)[0]) is not None
    assert t.lookup(keys(1, 2, 3)) == 2
    assert t.stats().hit_blocks[Medium.REMOTE] == 2
    store.down = True
    assert lookup_after_discovery(t, keys(3)) == 0, "an unreachable store is no hit"
    t.shutdown()


def test_an_answer_from_before_an_outage_is_not_adopted() -> None:
    store = FakeShared(set(keys(1, 2)))
    t = shared_tiered(store)
    t.lookup(keys(1, 2))
    t.wait_discoveries()
    store.outages += 1  # the server restarted after it answered
    assert t.lookup(keys(1, 2)) == 0
    assert len(t.secondaries[0]) == 0
    t.shutdown()


def test_a_shared_tier_is_forgotten_after_an_outage() -> None:
    # The server may have restarted empty: what this engine knew of it is stale.
    store = FakeShared(set(keys(1, 2)))
    t = shared_tiered(store)
    assert lookup_after_discovery(t, keys(1, 2)) == 2
    store.held.clear()
    store.outages += 1
    assert t.lookup(keys(1, 2)) == 0
    assert len(t.secondaries[0]) == 0
