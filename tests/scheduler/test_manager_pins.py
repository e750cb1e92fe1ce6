"""Keys listed twice: the batch fast paths must fall back to counting.

Load pins are counted per occurrence: ``prepare_load`` and ``complete_load`` must count
a key listed twice, or pinned by two loads, as two pins. ``complete_store`` of a key
listed twice stores it once (one stored event, one count, one slot)."""

from __future__ import annotations

import pytest

from kvtier.errors import ProtocolError
from kvtier.scheduler import CPUOffloadingManager

from .conftest import keys


def ready_tier(policy: str) -> CPUOffloadingManager:
    """A full tier of 2 READY blocks: any further store must evict one."""
    m = CPUOffloadingManager(num_blocks=2, block_size=16, eviction_policy=policy)
    m.prepare_store(keys(1, 2))
    m.complete_store(keys(1, 2))
    return m


def test_a_key_listed_twice_in_one_load_holds_two_pins(policy: str) -> None:
    m = ready_tier(policy)
    a, b = keys(1, 2)
    m.prepare_load([a, a])
    assert m.pins(a) == 2
    m.complete_load([a])
    assert m.pins(a) == 1
    out = m.prepare_store(keys(3))  # ``a`` is still pinned: ``b`` must go
    assert out is not None and out.block_hashes_evicted == (b,)
    m.complete_store(keys(3))
    m.complete_load([a])
    assert m.pins(a) == 0
    with pytest.raises(ProtocolError, match="not pinned"):
        m.complete_load([a])


def test_two_loads_of_a_block_release_it_only_after_both(policy: str) -> None:
    m = ready_tier(policy)
    a, b = keys(1, 2)
    m.prepare_load([a, b])
    m.prepare_load([a])
    assert (m.pins(a), m.pins(b)) == (2, 1)
    with pytest.raises(ProtocolError, match="not pinned"):
        m.complete_load([b, b])  # one pin too many: nothing changes
    assert (m.pins(a), m.pins(b)) == (2, 1)
    m.complete_load([a, b])
    assert (m.pins(a), m.pins(b)) == (1, 0)
    assert m.prepare_store(keys(3)) is not None  # b evictable again, a still held
    assert m.pins(a) == 1


def test_unpinning_a_key_twice_that_has_one_pin_fails_and_changes_nothing(policy: str) -> None:
    m = ready_tier(policy)
    a, b = keys(1, 2)
    m.prepare_load([a])
    with pytest.raises(ProtocolError, match="not pinned"):
        m.complete_load([a, a])
    assert m.pins(a) == 1
    out = m.prepare_store(keys(3))  # ``a`` still pinned: ``b`` must go
    assert out is not None and out.block_hashes_evicted == (b,)


def test_completing_a_store_of_a_key_listed_twice_stores_it_once(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=4, block_size=16, eviction_policy=policy)
    m.enable_events = True
    a, b = keys(1, 2)
    m.prepare_store([a, b])
    m.complete_store([a, b, a])
    assert m.stats().stored == 2
    assert [e.block_hashes for e in m.take_events()] == [(a, b)]
    m.prepare_store(keys(3))
    m.complete_store(keys(3, 3), success=False)
    assert m.stats().store_failures == 1 and m.num_free == 2
