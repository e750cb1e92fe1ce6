"""``RecencyList``'s parking, case by case: the order stays exact LRU order.

Parked blocks wait in a heap by parking order; these pin each rule of that heap with
keys whose names sort against their parking order, so a heap that fell back on the
keys' own order would be caught. (Written to kill mutants that survived
``scripts/mutate.sh``.)
"""

from __future__ import annotations

import itertools

import pytest

from kvtier.scheduler.policies import make_policy
from kvtier.scheduler.policies.recency import (
    FRESH_BATCHES,
    STALE_FACTOR,
    STALE_SLACK,
    RecencyList,
)
from kvtier.scheduler.policies.timed import TimedRecencyList


def order(rl: RecencyList[str], held: set[str] = frozenset(), protected: set[str] = frozenset()):  # type: ignore[assignment]
    gen = rl.evictable(held.__contains__, protected)
    try:
        return list(gen)
    finally:
        gen.close()


def parked_list(*keys: str) -> RecencyList[str]:
    """A list holding ``keys``, coldest first, every one of them parked."""
    rl: RecencyList[str] = RecencyList()
    rl.add_all(keys)
    assert order(rl, set(keys)) == []
    return rl


def test_released_blocks_come_back_in_parking_order_not_key_order() -> None:
    rl = parked_list("z", "y", "x")
    rl.add("a")
    rl.release("x")
    rl.release("z")
    assert order(rl, {"y"}) == ["z", "x", "a"]


def test_a_released_block_held_again_is_not_offered() -> None:
    rl = parked_list("z", "y")
    rl.release("z")
    rl.release("y")
    assert order(rl, {"z"}) == ["y"]
    rl.release("z")
    assert order(rl) == ["z", "y"]


def test_a_touched_parked_block_is_offered_where_the_touch_put_it() -> None:
    rl = parked_list("z", "y")
    rl.add("a")
    rl.release("z")
    rl.release("y")
    rl.touch("z")  # its heap entry is stale now
    assert order(rl) == ["y", "a", "z"]


def test_a_stale_entry_of_a_block_parked_again_is_not_its_place() -> None:
    """z's first release left an entry for its first parking; touched and parked
    again after y and x, z comes back by its new parking number only (the search
    that parked it again stopped at w, before reaching the stale entry)."""
    rl = parked_list("w", "z")
    rl.release("z")  # heap entry for z's first parking
    rl.add_all(["y", "x"])
    rl.touch("z")  # unparked, after x: the entry is stale
    rl.release("w")
    held = {"y", "x", "z"}
    assert rl.coldest(1, held.__contains__, ()) == ["w"]  # parks y, x, then z again
    for key in ("y", "x", "z"):
        rl.release(key)
    assert order(rl) == ["w", "y", "x", "z"]


def test_stale_heap_entries_stay_bounded_when_the_offered_block_is_never_evicted() -> None:
    """Regression: a search drops stale heap entries only up to the first key it
    offers. A list whose coldest released key is offered but never chosen (a
    ``density`` class ranked above the others) kept one stale entry per cycle of a
    block pinned, parked, released and touched: 10,001 entries after 10,000 cycles."""
    rl = parked_list("a")
    rl.release("a")  # offered first from now on, never evicted
    rl.add("b")
    for _ in range(1000):
        gen = rl.evictable({"b"}.__contains__, ())  # b, held by a load, is parked
        assert next(gen) == "a"
        gen.close()
        rl.release("b")
        rl.touch("b")  # the next request uses it: its heap entry is stale now
    assert len(rl._released) <= STALE_FACTOR * len(rl._parked) + STALE_SLACK
    assert order(rl) == ["a", "b"]


def test_a_block_released_twice_is_offered_once() -> None:
    rl = parked_list("z")
    rl.release("z")
    rl.release("z")
    assert order(rl) == ["z"]


def test_offered_blocks_not_evicted_are_offered_again() -> None:
    rl = parked_list("z", "y")
    rl.release("z")
    rl.release("y")
    assert order(rl, protected={"z"}) == ["y"]
    assert order(rl) == ["z", "y"]
    assert order(rl) == ["z", "y"]
    rl.remove("z")
    assert order(rl) == ["y"]
    assert len(rl) == 1


@pytest.mark.parametrize("name", ["arc", "slru"])
def test_removing_a_block_that_is_not_there_names_it(name: str) -> None:
    policy = make_policy(name, 2)
    with pytest.raises(KeyError, match="gone"):
        policy.remove(b"gone")


def test_a_stored_batch_released_while_blocks_are_parked_is_released_whole() -> None:
    """A batch added while some key is parked is noted, and its release visits no
    parked key; a parking in between forgets the note, so a batch key parked since
    is still released and offered."""
    rl = parked_list("p")  # p parked: later batches are noted
    rl.add_all(["a", "b"])
    assert list(rl._fresh.values()) == [["a", "b"]]
    rl.release_all(["a", "b"])  # the usual store: nothing parked to release
    assert rl._fresh == {} and order(rl, {"p"}) == ["a", "b"]
    rl.add_all(["c", "d"])
    assert order(rl, {"p", "a", "b", "c"}) == ["d"]  # parks a, b, c: the note goes
    assert rl._fresh == {}
    rl.release_all(["c", "d"])
    rl.release_all(["a"])
    assert order(rl, {"p"}) == ["a", "c", "d"]


def test_a_batch_released_in_another_order_or_in_part_is_looked_up() -> None:
    plain: RecencyList[str] = RecencyList()
    plain.add_all(["x"])  # nothing parked: nothing to note
    assert plain._fresh == {}
    rl = parked_list("p")
    rl.add_all(["a", "b", "c"])
    rl.release_all(["c", "b", "a"])  # not the noted batch: each key looked up
    rl.release_all(["a", "b"])
    assert list(rl._fresh.values()) == [["a", "b", "c"]]
    rl.release("p")
    assert order(rl) == ["p", "a", "b", "c"]


def test_a_batch_named_like_a_note_but_holding_a_parked_key_releases_it() -> None:
    """A note is found by its batch's first and last key and length, and used only
    when the released batch is the same list of keys."""
    rl = parked_list("p", "q")
    rl.add_all(["a", "b", "c"])
    rl.release_all(["a", "p", "c"])  # the note's first, last and length, not its keys
    assert order(rl) == ["p", "a", "b", "c"]  # p released; q still held back
    rl.add_all(["d", "e"])
    rl.release_all(("d", "e"))  # the noted keys as a tuple: the same batch
    assert rl._fresh == {}
    rl.add_all([])  # nothing to note
    assert rl._fresh == {}


def test_notes_are_kept_for_the_last_batches_only() -> None:
    rl = parked_list("p")
    batches = [[f"k{i}"] for i in range(FRESH_BATCHES + 3)]
    for batch in batches:
        rl.add_all(batch)
    assert list(rl._fresh.values()) == batches[3:]
    rl.release_all(batches[0])  # forgotten: looked up, and not parked
    assert order(rl, {"p"}) == [key for (key,) in batches]


def test_a_timed_list_notes_its_batches_too() -> None:
    rl: TimedRecencyList[str] = TimedRecencyList(itertools.count())
    rl.add("p")
    rl.add_all(["x"])  # nothing parked yet: nothing to note
    assert rl._fresh == {}
    assert order(rl, {"p"}) == ["x"]
    rl.add_all(["a"])
    assert list(rl._fresh.values()) == [["a"]]
