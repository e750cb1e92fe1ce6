"""TierManager details a caller sees: exact counters and slots, error messages,
admission's memory, restore, adopt and events (written for the survivors of mutation
testing)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest

from kvtier.blocks import BlockId, Medium
from kvtier.errors import ConfigError, ProtocolError
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.protocol import ManagerStats, OffloadingEvent
from kvtier.scheduler.slots import FreeSlots

from .conftest import keys


def make(n: int = 4, **kw: object) -> CPUOffloadingManager:
    return CPUOffloadingManager(num_blocks=n, block_size=16, **kw)  # type: ignore[arg-type]


def store(m: TierManager, ks: list[bytes]) -> None:
    out = m.prepare_store(ks)
    assert out is not None
    m.complete_store(out.block_hashes_to_store)


def test_a_fresh_manager_counts_nothing_and_holds_nothing() -> None:
    m = make(3)
    assert m.stats() == ManagerStats()
    assert (len(m), m.num_free, m.keys()) == (0, 3, [])
    assert (m.state(b"x"), m.pins(b"x"), m.slot(b"x")) == (None, 0, None)
    assert not m.has_pending_work
    assert m.shutdown() is None
    assert list(m.take_events()) == []


def test_every_counter_by_hand() -> None:
    m = make(2, store_threshold=2)
    m.lookup(keys(1, 2, 3))
    m.lookup(keys(1, 2))
    out = m.prepare_store(keys(1, 2, 3))  # k3 seen once: skipped
    assert out is not None and out.block_hashes_to_store == tuple(keys(1, 2))
    m.complete_store(keys(1), success=True)
    m.complete_store(keys(2), success=False)
    m.lookup(keys(1, 3))
    m.lookup(keys(3))  # k3 seen three times now
    m.prepare_load(keys(1))
    out = m.prepare_store(keys(3, 4, 5))  # k3 admitted now, into the free slot
    assert out is not None and out.block_hashes_to_store == tuple(keys(3))
    assert m.stats() == ManagerStats(
        lookups=4,
        lookup_blocks=8,
        hit_blocks=1,
        stores=3,
        stored=1,
        store_failures=1,
        stores_skipped=3,  # k3 (first store), k4 and k5 (never looked up)
        stores_rejected=0,
        evictions=0,
        loads=1,
    )


def test_rejected_stores_count_every_block_of_the_call() -> None:
    m = make(2)
    store(m, keys(1, 2))
    m.prepare_load(keys(1, 2))
    assert m.prepare_store(keys(3, 4, 3)) is None
    assert m.prepare_store(keys(5, 6, 7)) is None, "more than the tier holds"
    s = m.stats()
    assert (s.stores_rejected, s.evictions, s.stores, s.loads) == (5, 0, 2, 2)


def test_slots_are_handed_out_lowest_first_and_reused_last_freed_first() -> None:
    m = make(4)
    out = m.prepare_store(keys(1, 2))
    assert out is not None and out.store_spec == CPULoadStoreSpec((BlockId(1), BlockId(0)))
    m.complete_store(keys(1, 2))
    assert (m.slot(keys(1)[0]), m.slot(keys(2)[0]), m.num_free) == (1, 0, 2)
    assert m.discard(keys(2)) == keys(2)
    out = m.prepare_store(keys(3, 4))
    assert out is not None and list(out.store_spec.block_ids) == [2, 0]  # type: ignore[attr-defined]


def test_load_specs_name_the_slots_in_key_order() -> None:
    m = make(4)
    store(m, keys(1, 2, 3))
    spec = m.prepare_load(keys(3, 1))
    assert spec == CPULoadStoreSpec((m.slot(keys(3)[0]), m.slot(keys(1)[0])))  # type: ignore[arg-type]
    m.complete_load(keys(3, 1))


def test_a_key_loaded_twice_is_pinned_twice_and_needs_two_completions() -> None:
    m = make(2)
    store(m, keys(1, 2))
    m.prepare_load(keys(1, 1))
    assert m.pins(keys(1)[0]) == 2
    assert m.prepare_store(keys(3, 4)) is None, "k1 is held"
    m.complete_load(keys(1))
    assert m.pins(keys(1)[0]) == 1
    with pytest.raises(ProtocolError, match="not pinned by a load"):
        m.complete_load(keys(1, 1))
    assert m.pins(keys(1)[0]) == 1, "nothing unpinned"
    m.complete_load(keys(1))
    out = m.prepare_store(keys(3, 4))
    assert out is not None and sorted(out.block_hashes_evicted) == keys(1, 2)


def test_protocol_errors_say_what_was_wrong_with_which_block() -> None:
    m = make(2)
    out = m.prepare_store(keys(1))
    assert out is not None
    with pytest.raises(ProtocolError, match=r"^prepare_load: block 6b31 is storing, not ready$"):
        m.prepare_load(keys(1))
    with pytest.raises(ProtocolError, match=r"^prepare_load: block 6b32 is absent, not ready$"):
        m.prepare_load(keys(2))
    with pytest.raises(ProtocolError, match=r"^complete_load: block 6b31 is not pinned by a load$"):
        m.complete_load(keys(1))
    with pytest.raises(
        ProtocolError, match=r"^complete_store: block 6b32 was not prepared for storing$"
    ):
        m.complete_store(keys(1, 2))
    assert m.state(keys(1)[0]) is BlockState.STORING, "nothing changed"
    long_key = bytes(range(20))
    short = long_key.hex()[:16]
    with pytest.raises(ProtocolError, match=f"^prepare_load: block {short} is absent, not ready$"):
        m.prepare_load([long_key])
    with pytest.raises(ProtocolError, match=f"^complete_load: block {short} is not pinned"):
        m.complete_load([long_key])
    with pytest.raises(ProtocolError, match=f"^complete_store: block {short} was not prepared"):
        m.complete_store([long_key])
    with pytest.raises(ProtocolError, match=r"^restore: 1 blocks into a tier of 2 holding 1$"):
        m.restore(keys(5))


def test_config_errors_name_the_key_and_the_value() -> None:
    for bad in (0, -1, True, 2.0, "4"):
        with pytest.raises(ConfigError, match=r"num_blocks.*must be a positive integer"):
            make(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="num_blocks"):
            TierManager(
                medium=Medium.DISK,
                num_blocks=bad,  # type: ignore[arg-type]
                block_size=16,
                policy=make_policy("lru", 4),
            )
    for bad_threshold in (-1, True, 1.5, None):
        with pytest.raises(ConfigError, match=r"store_threshold.*must be an integer >= 0"):
            make(4, store_threshold=bad_threshold)
    make(1)
    make(4, store_threshold=0)
    with pytest.raises(ConfigError, match=r"block_size.*must be a positive integer, got 0"):
        CPUOffloadingManager(num_blocks=4, block_size=0)


def test_admission_remembers_four_times_the_capacity_oldest_forgotten_first() -> None:
    m = make(1, store_threshold=2)
    m.lookup(keys(1))
    for i in range(2, 6):  # four more keys: k1 is the fifth most recent, forgotten
        m.lookup(keys(i))
    m.lookup(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == (), "k1 seen once, as new"
    m.lookup(keys(3))  # k3 (k2 went for k1) was remembered: seen twice now
    out = m.prepare_store(keys(3))
    assert out is not None and out.block_hashes_to_store == tuple(keys(3))


def test_a_lookup_moves_a_key_to_the_recent_end_of_admission_memory() -> None:
    m = make(1, store_threshold=3)
    m.lookup(keys(1))
    m.lookup(keys(2, 3, 4))
    m.lookup(keys(1))  # k1 now the most recent of four
    m.lookup(keys(5))  # forgets k2, not k1
    m.lookup(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1))
    m.complete_store(keys(1))
    m.lookup(keys(9, 2))  # k9 misses, k2 counted once (it was forgotten)
    m.lookup(keys(2))
    out = m.prepare_store(keys(2))
    assert out is not None and out.block_hashes_to_store == ()


def test_resident_keys_are_not_counted_for_admission() -> None:
    m = make(2, store_threshold=2)
    m.lookup(keys(2))
    m.lookup(keys(2))
    store(m, keys(2))
    for _ in range(3):
        assert m.lookup(keys(1, 2)) == 0  # k2 is resident, past the miss
    m.count_seen(keys(2))
    assert m.discard(keys(2)) == keys(2)
    m.lookup(keys(2))
    out = m.prepare_store(keys(2))
    assert out is not None and out.block_hashes_to_store == (), "k2 counted once since"


def test_a_stored_key_starts_admission_again_from_zero() -> None:
    m = make(2, store_threshold=2)
    m.lookup(keys(1))
    m.lookup(keys(1))
    store(m, keys(1))
    assert m.discard(keys(1)) == keys(1)
    m.lookup(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == ()


def test_count_seen_counts_only_with_a_threshold() -> None:
    m = make(2, store_threshold=2)
    m.count_seen(keys(1))
    m.count_seen(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1))
    for threshold in (0, 1):
        plain = make(2, store_threshold=threshold)
        plain.count_seen(keys(1))
        out = plain.prepare_store(keys(1))
        assert out is not None and out.block_hashes_to_store == tuple(keys(1))
        assert plain.stats().stores_skipped == 0


def test_a_threshold_of_three_needs_three_uses() -> None:
    m = make(2, store_threshold=3)
    m.lookup(keys(1))
    m.count_seen(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == ()
    m.lookup(keys(1))
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1))


def test_restore_gives_the_ith_key_slot_i_ready_and_unpinned() -> None:
    m = make(4)
    assert m.restore(keys(1, 2, 1, 3)) == [0, 1, 2]
    assert [m.slot(k) for k in keys(1, 2, 3)] == [0, 1, 2]
    assert all(m.state(k) is BlockState.READY and m.pins(k) == 0 for k in keys(1, 2, 3))
    assert m.num_free == 1 and m.lookup(keys(1, 2, 3)) == 3
    out = m.prepare_store(keys(4, 5))
    assert out is not None and out.block_hashes_evicted == tuple(keys(1)), "coldest first"
    with pytest.raises(ProtocolError, match="restore"):
        make(2).restore(keys(1, 2, 3))
    assert make(2).restore(keys(1, 2)) == [0, 1]


def test_adopt_counts_blocks_as_stored_and_returns_none_without_room() -> None:
    disk = TierManager(
        medium=Medium.DISK,
        num_blocks=2,
        block_size=16,
        policy=make_policy("lru", 2),
        enable_events=True,
    )
    assert disk.adopt(keys(1, 2)) == keys(1, 2)
    assert all(disk.state(k) is BlockState.READY for k in keys(1, 2))
    s = disk.stats()
    assert (s.stores, s.stored) == (2, 2)
    assert disk.adopt(keys(1)) == []
    disk.prepare_load(keys(1, 2))
    assert disk.adopt(keys(3)) == []
    assert list(disk.take_events()) == [
        OffloadingEvent(tuple(keys(1, 2)), 16, Medium.DISK, removed=False)
    ]
    spec = disk.prepare_load(keys(2))
    assert isinstance(spec, DiskLoadStoreSpec) and spec.block_hashes == tuple(keys(2))


def test_events_list_each_transition_once_in_order() -> None:
    m = make(2, enable_events=True)
    store(m, keys(1, 2))
    out = m.prepare_store(keys(3))
    assert out is not None
    m.complete_store(keys(3), success=False)
    m.complete_store(keys(2))  # READY already: no event
    assert m.discard(keys(2)) == keys(2)
    assert list(m.take_events()) == [
        OffloadingEvent(tuple(keys(1, 2)), 16, Medium.CPU, removed=False),
        OffloadingEvent(tuple(keys(1)), 16, Medium.CPU, removed=True),
        OffloadingEvent(tuple(keys(2)), 16, Medium.CPU, removed=True),
    ]
    quiet = make(2)
    store(quiet, keys(1, 2))
    store(quiet, keys(3))
    quiet.discard(keys(3))
    assert list(quiet.take_events()) == []


def test_a_store_of_exactly_the_capacity_evicts_everything_else() -> None:
    m = make(2)
    store(m, keys(1, 2))
    out = m.prepare_store(keys(3, 4))
    assert out is not None and sorted(out.block_hashes_evicted) == keys(1, 2)
    assert m.stats().evictions == 2


def test_a_store_listing_a_key_twice_stores_it_once() -> None:
    m = make(2)
    out = m.prepare_store(keys(1, 1, 2))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1, 2))
    m.complete_store(keys(1, 2, 1))
    assert m.stats().stored == 2


def test_a_store_listing_keys_twice_stores_each_once_in_first_listed_order() -> None:
    m = make(8)
    store(m, keys(7))
    out = m.prepare_store(keys(5, 7, 3, 5, 9, 3, 1))
    assert out is not None and out.block_hashes_to_store == tuple(keys(5, 3, 9, 1))
    assert [m.slot(k) for k in keys(5, 3, 9, 1)] == list(out.store_spec.block_ids)
    assert len(m) == 5 and m.num_free == 3


def test_a_store_protects_its_own_keys_in_long_lists_too() -> None:
    # Eight or more keys take the set path for the protected keys.
    m = make(8)
    store(m, keys(*range(8)))
    out = m.prepare_store([*keys(*range(7)), *keys(8)])
    assert out is not None and out.block_hashes_evicted == tuple(keys(7))
    store(m, [])


def test_can_store_counts_resident_ready_blocks_of_the_head_as_taken() -> None:
    m = make(3)
    store(m, keys(1, 2, 3))
    assert m.can_store(keys(1, 4)) == 2, "k4 evicts k2 or k3, never k1"
    assert m.can_store(keys(1, 2, 4)) == 3
    assert m.can_store(keys(1, 2, 3, 4)) == 3
    assert m.can_store(keys(1, 1, 2, 4)) == 4, "a key listed twice is counted once"
    m.prepare_load(keys(3))
    assert m.can_store(keys(1, 4)) == 2
    assert m.can_store(keys(1, 2, 4)) == 2
    assert m.can_store(keys(3, 4, 5)) == 3
    assert m.can_store(keys(4, 4, 5, 6)) == 3


def test_can_store_with_admission_skips_or_stops_at_unadmitted_keys() -> None:
    m = make(1, store_threshold=2)
    m.lookup(keys(2))
    m.lookup(keys(2))
    assert m.can_store(keys(1, 2)) == 2
    assert m.can_store(keys(1, 2), whole=True) == 0
    assert m.can_store(keys(2, 1), whole=True) == 1
    m.lookup(keys(3))
    m.lookup(keys(3))
    assert m.can_store(keys(2, 3)) == 1
    assert m.can_store(keys(1, 2, 3)) == 2, "k1 is skipped, k3 does not fit"


def test_free_slots_match_a_plain_stack() -> None:
    free = FreeSlots(5)
    stack = [4, 3, 2, 1, 0]
    assert len(free) == 5
    assert free.take(2) == stack[-2:] == [1, 0]
    del stack[-2:]
    free.extend([BlockId(0), BlockId(1)])
    stack += [0, 1]
    free.append(BlockId(7))
    stack.append(7)
    assert len(free) == len(stack) == 6
    assert free.take(4) == stack[-4:]
    del stack[-4:]
    assert free.pop() == stack.pop() == 3
    assert len(free) == 1
    with pytest.raises(IndexError, match="take 2 slots from 1 free"):
        free.take(2)
    assert free.take(1) == [4] and len(free) == 0
    with pytest.raises(IndexError):
        free.pop()
    assert free.take(0) == []


def test_a_threshold_of_one_admits_everything_in_can_store_too() -> None:
    m = make(1, store_threshold=1)
    assert m.can_store(keys(1, 2)) == 1
    assert m.can_store(keys(1, 2), whole=True) == 1
    out = m.prepare_store(keys(1))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1))


def test_a_discard_that_drops_nothing_records_no_event() -> None:
    m = make(2, enable_events=True)
    assert m.discard(keys(1)) == []
    assert list(m.take_events()) == []


def test_a_policy_that_chooses_a_held_block_is_caught_before_anything_changes() -> None:
    class Careless(LRUPolicy):
        """Chooses the coldest blocks, held or not (a broken strategy)."""

        def choose_victims(
            self,
            n: int,
            is_held: object,
            protected: Collection[bytes],
            incoming: Sequence[bytes],
        ) -> list[bytes] | None:
            return keys(1)[:n]

    m = TierManager(medium=Medium.CPU, num_blocks=1, block_size=16, policy=Careless(1))
    store(m, keys(1))
    m.prepare_load(keys(1))
    with pytest.raises(AssertionError, match=r"^policy chose a held block$"):
        m.prepare_store(keys(2))
    assert m.pins(keys(1)[0]) == 1 and m.state(keys(1)[0]) is BlockState.READY


def test_config_errors_are_exact() -> None:
    with pytest.raises(ConfigError, match=r"^config key 'num_blocks': must be a positive"):
        make(0)
    with pytest.raises(ConfigError, match=r"^config key 'num_blocks': must be a positive"):
        TierManager(medium=Medium.DISK, num_blocks=0, block_size=16, policy=make_policy("lru", 1))
    with pytest.raises(ConfigError, match=r"^config key 'block_size': must be a positive"):
        TierManager(medium=Medium.DISK, num_blocks=1, block_size=0, policy=make_policy("lru", 1))
    with pytest.raises(ConfigError, match=r"^config key 'store_threshold': must be an integer"):
        make(1, store_threshold=-1)


def test_a_tier_records_events_only_when_asked() -> None:
    m = TierManager(medium=Medium.DISK, num_blocks=1, block_size=16, policy=make_policy("lru", 1))
    store(m, keys(1))
    store(m, keys(2))
    assert list(m.take_events()) == []


def test_pins_are_counted_whatever_else_is_pinned() -> None:
    m = make(4)
    store(m, keys(1, 2, 3, 9))
    m.prepare_load(keys(9))
    m.prepare_load(keys(1, 1, 1))
    assert m.pins(keys(1)[0]) == 3
    m.complete_load(keys(1, 1, 1))
    assert m.pins(keys(1)[0]) == 0
    m.prepare_load(keys(1, 1))  # one key pinned twice, k9 once
    m.complete_load(keys(1, 1))
    assert (m.pins(keys(1)[0]), m.pins(keys(9)[0])) == (0, 1)
    m.prepare_load(keys(2, 3))
    with pytest.raises(ProtocolError, match="not pinned by a load"):
        m.complete_load(keys(2, 2, 2, 2, 2))
    assert [m.pins(k) for k in keys(2, 3, 9)] == [1, 1, 1], "nothing unpinned"


def test_a_key_listed_three_times_with_another_store_in_flight_is_stored_once() -> None:
    m = make(4, enable_events=True)
    for ks in (keys(9), keys(1)):
        out = m.prepare_store(ks)
        assert out is not None
    m.complete_store(keys(1, 1, 1))
    assert m.stats().stored == 1
    assert list(m.take_events()) == [OffloadingEvent(tuple(keys(1)), 16, Medium.CPU, False)]


class _Observed(LRUPolicy):
    """LRU that records what ``observe`` was shown."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.seen: list[list[bytes]] = []

    def observe(self, keys: Sequence[bytes]) -> None:
        self.seen.append(list(keys))


def test_a_lookup_from_start_counts_from_there_and_shows_the_policy_the_whole_prefix() -> None:
    policy = _Observed(8)
    m = TierManager(medium=Medium.CPU, num_blocks=8, block_size=16, policy=policy)
    store(m, keys(2, 3, 5))
    ks = keys(1, 2, 3, 4, 5)
    assert m.lookup(ks) == 0  # k1 is not here
    assert m.lookup(ks, 1) == 2  # k2, k3; k4 ends the run
    assert m.lookup(ks, 4) == 1
    assert m.lookup(ks, 5) == 0
    assert policy.seen == [ks] * 4
    stats = m.stats()
    assert (stats.lookups, stats.lookup_blocks, stats.hit_blocks) == (4, 5 + 4 + 1 + 0, 3)


def test_admission_counts_the_keys_past_the_hit_from_start_on() -> None:
    m = make(8, store_threshold=2)
    m.lookup(keys(1, 2, 3), 1)
    m.lookup(keys(1, 2, 3), 1)  # k2 and k3 seen twice, k1 (the GPU's) never
    out = m.prepare_store(keys(1, 2, 3))
    assert out is not None and out.block_hashes_to_store == tuple(keys(2, 3))


def test_a_block_in_flight_after_start_ends_the_run() -> None:
    m = make(8)
    store(m, keys(1, 2))
    out = m.prepare_store(keys(3, 4))
    assert out is not None  # k3, k4 storing
    assert m.lookup(keys(1, 2, 3, 4), 1) == 1
    m.complete_store(keys(3, 4))
    assert m.lookup(keys(1, 2, 3, 4), 1) == 3
