"""The OffloadingManager contract, run against every registered eviction policy."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError, ProtocolError
from kvtier.load_store_specs import CPULoadStoreSpec
from kvtier.scheduler import CPUOffloadingManager, OffloadingManager

from .conftest import keys


def make(policy: str, n: int = 4, **kw: object) -> CPUOffloadingManager:
    return CPUOffloadingManager(num_blocks=n, block_size=16, eviction_policy=policy, **kw)


def store(m: CPUOffloadingManager, ks: list[bytes]) -> None:
    out = m.prepare_store(ks)
    assert out is not None
    m.complete_store(out.block_hashes_to_store)


def test_is_an_offloading_manager(policy: str) -> None:
    assert isinstance(make(policy), OffloadingManager)


def test_lookup_counts_only_ready_blocks_from_the_first(policy: str) -> None:
    m = make(policy)
    assert m.lookup(keys(1, 2)) == 0
    out = m.prepare_store(keys(1, 2))
    assert out is not None
    assert m.lookup(keys(1, 2)) == 0, "STORING blocks are not loadable yet"
    m.complete_store(keys(1, 2))
    assert m.lookup(keys(1, 2, 3)) == 2
    assert m.lookup(keys(3, 1, 2)) == 0, "the run starts at the first key"


def test_prepare_store_returns_slots_in_key_order_and_skips_resident(policy: str) -> None:
    m = make(policy)
    store(m, keys(1))
    out = m.prepare_store(keys(1, 2, 3))
    assert out is not None
    assert out.block_hashes_to_store == tuple(keys(2, 3))
    assert isinstance(out.store_spec, CPULoadStoreSpec)
    ids = out.store_spec.block_ids
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(0 <= i < 4 for i in ids)
    assert m.slot(keys(1)[0]) not in ids
    assert out.block_hashes_evicted == ()


def test_prepare_load_pins_and_gives_slots(policy: str) -> None:
    m = make(policy)
    out = m.prepare_store(keys(1, 2))
    assert out is not None
    m.complete_store(keys(1, 2))
    spec = m.prepare_load(keys(2, 1))
    assert isinstance(spec, CPULoadStoreSpec)
    assert spec.block_ids == (m.slot(keys(2)[0]), m.slot(keys(1)[0]))
    assert m.pins(keys(1)[0]) == 1
    m.complete_load(keys(2, 1))
    assert m.pins(keys(1)[0]) == 0


def test_prepare_load_of_unready_block_raises_and_pins_nothing(policy: str) -> None:
    m = make(policy)
    store(m, keys(1))
    assert m.prepare_store(keys(2)) is not None
    with pytest.raises(ProtocolError, match="storing"):
        m.prepare_load(keys(1, 2))
    with pytest.raises(ProtocolError, match="absent"):
        m.prepare_load(keys(1, 9))
    assert m.pins(keys(1)[0]) == 0


def test_complete_load_below_zero_raises(policy: str) -> None:
    m = make(policy)
    store(m, keys(1))
    with pytest.raises(ProtocolError):
        m.complete_load(keys(1))
    m.prepare_load(keys(1))
    with pytest.raises(ProtocolError):
        m.complete_load(keys(1, 1))
    assert m.pins(keys(1)[0]) == 1


def test_eviction_makes_room_and_reports_evicted(policy: str) -> None:
    m = make(policy, enable_events=True)
    store(m, keys(1, 2, 3, 4))
    out = m.prepare_store(keys(5, 6))
    assert out is not None
    assert len(out.block_hashes_evicted) == 2
    assert set(out.block_hashes_evicted) <= set(keys(1, 2, 3, 4))
    for k in out.block_hashes_evicted:
        assert k not in m
    events = list(m.take_events())
    assert [e.removed for e in events] == [False, True]
    assert events[1].block_hashes == out.block_hashes_evicted
    assert all(e.medium == "CPU" and e.block_size == 16 for e in events)
    assert list(m.take_events()) == []


def test_pinned_and_storing_blocks_are_never_evicted(policy: str) -> None:
    m = make(policy)
    store(m, keys(1, 2))
    m.prepare_load(keys(1))
    assert m.prepare_store(keys(3)) is not None  # storing, holds a slot
    out = m.prepare_store(keys(4, 5))
    assert out is not None
    assert out.block_hashes_evicted == tuple(keys(2))
    assert m.prepare_store(keys(6)) is None, "only held blocks are left"
    assert {*keys(1, 3, 4, 5)} == {k for k in keys(1, 2, 3, 4, 5, 6) if k in m}


def test_none_leaves_state_unchanged(policy: str) -> None:
    m = make(policy, enable_events=True)
    store(m, keys(1, 2, 3))
    m.prepare_load(keys(1, 2, 3))
    list(m.take_events())
    before = {k: (m.state(k), m.slot(k), m.pins(k)) for k in keys(1, 2, 3)}
    assert m.prepare_store(keys(4, 5)) is None
    assert {k: (m.state(k), m.slot(k), m.pins(k)) for k in keys(1, 2, 3)} == before
    assert keys(4)[0] not in m and m.num_free == 1
    assert list(m.take_events()) == []
    assert m.stats().stores_rejected == 2


def test_store_larger_than_capacity_is_refused(policy: str) -> None:
    m = make(policy, n=2)
    assert m.prepare_store(keys(1, 2, 3)) is None
    assert len(m) == 0


def test_failed_store_drops_only_blocks_that_never_became_ready(policy: str) -> None:
    m = make(policy)
    store(m, keys(1))
    assert m.prepare_store(keys(1, 2)) is not None
    m.complete_store(keys(1, 2), success=False)
    assert keys(1)[0] in m and keys(2)[0] not in m
    assert m.num_free == 3
    assert m.stats().store_failures == 1


def test_complete_store_of_unknown_key_raises_and_changes_nothing(policy: str) -> None:
    m = make(policy)
    assert m.prepare_store(keys(1)) is not None
    with pytest.raises(ProtocolError):
        m.complete_store(keys(1, 9))
    assert m.lookup(keys(1)) == 0


def test_touch_ignores_absent_keys(policy: str) -> None:
    m = make(policy)
    m.touch(keys(1, 2))
    store(m, keys(3))
    m.touch(keys(1, 3, 2))
    assert m.lookup(keys(3)) == 1


def test_stats_count_lookups_hits_stores_evictions(policy: str) -> None:
    m = make(policy, n=2)
    store(m, keys(1, 2))
    m.lookup(keys(1, 2, 3))
    store(m, keys(3))
    s = m.stats()
    assert (s.lookups, s.lookup_blocks, s.hit_blocks) == (1, 3, 2)
    assert (s.stores, s.stored, s.evictions) == (3, 3, 1)


def test_store_threshold_admits_blocks_only_after_reuse(policy: str) -> None:
    m = make(policy, store_threshold=2)
    m.lookup(keys(1, 2))
    out = m.prepare_store(keys(1, 2))
    assert out is not None and out.block_hashes_to_store == ()
    assert m.stats().stores_skipped == 2
    m.lookup(keys(1))
    out = m.prepare_store(keys(1, 2))
    assert out is not None and out.block_hashes_to_store == tuple(keys(1))


def test_bad_arguments_name_the_key(policy: str) -> None:
    with pytest.raises(ConfigError, match="num_blocks"):
        CPUOffloadingManager(num_blocks=0, block_size=16, eviction_policy=policy)
    with pytest.raises(ConfigError, match="block_size"):
        CPUOffloadingManager(num_blocks=4, block_size=-1, eviction_policy=policy)
    with pytest.raises(ConfigError, match="store_threshold"):
        CPUOffloadingManager(num_blocks=4, block_size=16, store_threshold=-1)
    with pytest.raises(ConfigError, match="eviction_policy"):
        CPUOffloadingManager(num_blocks=4, block_size=16, eviction_policy="mru")


def test_discard_drops_only_ready_unpinned_blocks(policy: str) -> None:
    m = make(policy, enable_events=True)
    store(m, keys(1, 2))
    m.prepare_load(keys(2))
    assert m.prepare_store(keys(3)) is not None
    list(m.take_events())
    assert m.discard(keys(1, 2, 3, 9)) == keys(1)
    assert keys(1)[0] not in m and m.pins(keys(2)[0]) == 1 and keys(3)[0] in m
    assert m.num_free == 2
    (event,) = m.take_events()
    assert event.removed and event.block_hashes == tuple(keys(1))
