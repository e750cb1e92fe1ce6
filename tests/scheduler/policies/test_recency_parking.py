"""``RecencyList``'s parking, case by case: the order stays exact LRU order.

Parked blocks wait in a heap by parking order; these pin each rule of that heap with
keys whose names sort against their parking order, so a heap that fell back on the
keys' own order would be caught. (Written to kill mutants that survived
``scripts/mutate.sh``.)
"""

from __future__ import annotations

import pytest

from kvtier.scheduler.policies import make_policy
from kvtier.scheduler.policies.recency import RecencyList


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
