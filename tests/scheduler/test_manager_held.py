"""What eviction must not take: STORING blocks and pinned ones, kept apart.

The manager asks its policy "is this block held?" through ``HeldBlocks`` over its
``_storing`` and ``_pinned`` sets; the policies' fast path asks for a whole
batch of coldest blocks at once (``any_of``). Each test here fails if one of the two is
left out of an answer, or if a pin or a store leaves the wrong state behind.
"""

from __future__ import annotations

import pytest

from kvtier.errors import ProtocolError
from kvtier.scheduler import CPUOffloadingManager
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.policies.base import HeldBlocks
from kvtier.scheduler.policies.recency import RecencyList

from .conftest import keys


def held_over(storing: set[bytes], pinned: set[bytes]) -> HeldBlocks:
    """A ``HeldBlocks`` over the STORING and the pinned blocks."""
    return HeldBlocks(storing, pinned)


def test_held_blocks_answer_for_either_kind_and_follow_changes_in_place() -> None:
    storing: set[bytes] = {b"s"}
    pinned: set[bytes] = {b"p", b"y"}
    held = HeldBlocks(storing, pinned)
    assert held.n_pinned == 2
    assert (held(b"s"), held(b"p"), held(b"x"), held(b"y")) == (True, True, False, True)
    assert held.any_of([b"x", b"s"]) and held.any_of([b"p", b"x"]) and held.any_of([b"y"])
    assert not held.any_of([b"x"]) and not held.any_of([])
    storing.clear()
    pinned.add(b"x")
    assert held.n_pinned == 3
    assert (held(b"s"), held(b"x")) == (False, True)
    assert held.any_of([b"x"]) and not held.any_of([b"s"])
    pinned.clear()
    assert held.n_pinned == 0
    assert not held(b"x") and not held.any_of([b"x", b"p"])


@pytest.mark.parametrize("where", ["storing", "pinned"])
def test_the_coldest_batch_is_refused_whole_when_one_block_is_held(where: str) -> None:
    # ``coldest``'s one-pass check: a held block anywhere in the batch sends it to
    # the walk, which skips exactly that block.
    lst: RecencyList[bytes] = RecencyList()
    lst.add_all(keys(1, 2, 3, 4))
    storing: set[bytes] = set()
    pinned: set[bytes] = set()
    (storing if where == "storing" else pinned).add(b"k2")
    held = held_over(storing, pinned)
    assert lst.coldest(2, held, ()) == keys(1, 3)
    assert lst.coldest(4, held, ()) is None


def test_a_storing_block_at_the_cold_end_is_not_evicted(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=2, block_size=16, eviction_policy=policy)
    a, b, c = keys(1, 2, 3)
    m.prepare_store([a])  # a stays STORING: the coldest block, and held
    m.prepare_store([b])
    m.complete_store([b])
    out = m.prepare_store([c])
    assert out is not None and out.block_hashes_evicted == (b,)
    assert m.prepare_store(keys(4)) is None  # a and c both STORING: nothing to evict
    m.complete_store([a, c])
    out = m.prepare_store(keys(4, 5))
    assert out is not None and set(out.block_hashes_evicted) == {a, c}


def test_a_pinned_block_stays_held_while_stores_are_in_flight(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=3, block_size=16, eviction_policy=policy)
    a, b, c, d = keys(1, 2, 3, 4)
    m.prepare_store([a, b])
    m.complete_store([a, b])
    m.prepare_load([a])  # the coldest block, pinned
    m.prepare_store([c])  # in flight: STORING
    out = m.prepare_store([d])
    assert out is not None and out.block_hashes_evicted == (b,)
    assert m.prepare_store(keys(5)) is None  # a pinned, c and d STORING
    m.complete_load([a])
    out = m.prepare_store(keys(5))
    assert out is not None and out.block_hashes_evicted == (a,)


def test_a_load_refused_for_a_storing_block_pins_nothing(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=2, block_size=16, eviction_policy=policy)
    a, b = keys(1, 2)
    m.prepare_store([a, b])
    m.complete_store([b])
    with pytest.raises(ProtocolError, match="storing"):
        m.prepare_load([b, a])  # b is READY, a STORING: neither is pinned
    assert (m.pins(a), m.pins(b)) == (0, 0)
    m.complete_store([a])
    out = m.prepare_store(keys(3, 4))  # both evictable: no pin was left behind
    assert out is not None and set(out.block_hashes_evicted) == {a, b}


def test_unpinning_a_storing_block_fails_and_leaves_it_held(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=1, block_size=16, eviction_policy=policy)
    a = keys(1)[0]
    m.prepare_store([a])
    with pytest.raises(ProtocolError, match="not pinned"):
        m.complete_load([a])
    assert m.state(a) is BlockState.STORING
    assert m.prepare_store(keys(2)) is None  # still held by its store


def test_completing_a_load_of_a_key_listed_twice_releases_it_once(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=2, block_size=16, eviction_policy=policy)
    a, b = keys(1, 2)
    m.prepare_store([a, b])
    m.complete_store([a, b])
    m.prepare_load([a, a, b])
    m.complete_load([a, b])  # a keeps one pin
    assert m._is_held.n_pinned == 1 and (m.pins(a), m.pins(b)) == (1, 0)
    out = m.prepare_store(keys(3))
    assert out is not None and out.block_hashes_evicted == (b,)
    m.complete_load([a])
    assert m._is_held.n_pinned == 0
    out = m.prepare_store(keys(4))
    assert out is not None and out.block_hashes_evicted == (a,)


def test_discard_and_can_store_count_both_kinds_of_held_block(policy: str) -> None:
    m = CPUOffloadingManager(num_blocks=4, block_size=16, eviction_policy=policy)
    a, b, c, d = keys(1, 2, 3, 4)
    m.prepare_store([a, b, c])
    m.complete_store([a, b])
    m.prepare_load([a])  # a pinned, b evictable, c STORING, one slot free
    assert m.can_store(keys(5, 6, 7)) == 2  # the free slot and b's
    assert m.discard([a, b, c, d]) == [b]
    assert m.state(a) is BlockState.READY and m.state(c) is BlockState.STORING


def test_a_held_key_of_the_store_takes_no_room_from_it(policy: str) -> None:
    # A resident key among the store's own is kept from eviction; counted once off
    # the room only when it was evictable (READY, unpinned) to begin with.
    m = CPUOffloadingManager(num_blocks=4, block_size=16, eviction_policy=policy)
    a, b, c = keys(1, 2, 3)
    m.prepare_store([a, b, c])
    m.complete_store([a, b])
    m.prepare_load([a])  # a pinned, b evictable, c STORING, one slot free: room 2
    assert m.can_store([a, *keys(5, 6, 7)]) == 3
    assert m.can_store([c, *keys(5, 6, 7)]) == 3
    assert m.can_store([b, *keys(5, 6, 7)]) == 2


def test_restored_blocks_can_be_pinned_and_are_then_held(policy: str) -> None:
    # ``restore`` puts blocks in the slot map too: a pin holds them the same way.
    m = CPUOffloadingManager(num_blocks=3, block_size=16, eviction_policy=policy)
    a, b = keys(1, 2)
    m.restore([a, b])
    m.prepare_load([a])  # the coldest block, pinned
    out = m.prepare_store(keys(3, 4))
    assert out is not None and out.block_hashes_evicted == (b,)
