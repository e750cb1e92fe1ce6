"""``TimedRecencyList``: each add and touch stamps the key with the clock's next value.

The adaptive policy compares its two lists' coldest blocks by these times, so each
test names the exact times, worked out by hand: a stamp per key in call order (no
tick lost, none extra, in batches as key by key), a parked key keeping its time, a
touch of a parked key stamping it again, and a demotion (``transfer``) keeping the
block's time -- and, through the policy, a demoted block evicted by its old time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import AdaptivePolicy
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.timed import TimedRecencyList


def park(rl: RecencyList[str], is_held: Callable[[str], bool]) -> list[str]:
    """Search the list (parking its held run at the cold end); the evictable keys."""
    gen = rl.evictable(is_held, ())
    try:
        return list(gen)
    finally:
        gen.close()


def times(rl: TimedRecencyList[str]) -> dict[str, int]:
    return {key: rl.time(key) for key in rl.ordered()}


def pair() -> tuple[itertools.count[int], TimedRecencyList[str], TimedRecencyList[str]]:
    clock = itertools.count()
    return clock, TimedRecencyList(clock), TimedRecencyList(clock)


def test_adds_and_touches_stamp_each_key_once_in_call_order() -> None:
    clock, a, b = pair()
    a.add("x")  # 0
    b.add_all(["y", "z"])  # 1, 2
    a.add_all(["w"])  # 3
    a.touch("x")  # 4
    b.touch_all(["z", "y", "z"])  # 5, 6, 7: z keeps its last
    assert times(a) == {"w": 3, "x": 4}
    assert times(b) == {"y": 6, "z": 7}
    assert a.ordered() == ["w", "x"] and b.ordered() == ["y", "z"]
    assert next(clock) == 8  # no stamp lost, none drawn beyond the keys


def test_touch_listed_stamps_only_the_keys_it_touched() -> None:
    clock, a, _ = pair()
    a.add_all(["p", "q", "r"])  # 0, 1, 2
    assert park(a, {"p"}.__contains__) == ["q", "r"]  # p parked
    assert a.touch_listed(["r", "q", "p", "q"]) == 2  # stops at the parked p
    assert times(a) == {"p": 0, "r": 3, "q": 4}
    assert next(clock) == 5


def test_move_all_to_end_stamps_every_key_new_or_not() -> None:
    clock, a, _ = pair()
    a.add_all(["p", "q"])  # 0, 1
    park(a, {"p"}.__contains__)  # p parked
    a.move_all_to_end(["p", "n", "q"])  # 2, 3, 4: p leaves parking, n is new
    assert a.ordered() == ["p", "n", "q"]
    assert times(a) == {"p": 2, "n": 3, "q": 4}
    assert next(clock) == 5


def test_a_parked_key_keeps_its_time_and_a_touch_stamps_it_again() -> None:
    clock, a, b = pair()
    b.add("o")  # 0: times and parking numbers differ below
    a.add_all(["p", "q", "r"])  # 1, 2, 3
    assert park(a, {"p", "q"}.__contains__) == ["r"]  # parked as 0 and 1
    assert times(a) == {"p": 1, "q": 2, "r": 3}
    a.touch("q")  # parked: back to the hot end, stamped 4
    a.touch_all(["p"])  # parked, through the per-key path: 5
    assert a.ordered() == ["r", "q", "p"]
    assert times(a) == {"r": 3, "q": 4, "p": 5}
    assert next(clock) == 6


@pytest.mark.parametrize("parked", [False, True])
def test_transfer_moves_keys_to_the_hot_end_with_their_times(parked: bool) -> None:
    clock, a, b = pair()
    b.add("s")  # 0
    a.add_all(["p", "q", "r"])  # 1, 2, 3
    if parked:  # as 0 and 1: parking numbers differ from the times
        park(a, {"p", "q"}.__contains__)
    a.transfer(["q", "p"], b)
    assert a.ordered() == ["r"] and times(a) == {"r": 3}
    assert b.ordered() == ["s", "q", "p"]
    assert times(b) == {"s": 0, "q": 2, "p": 1}
    assert next(clock) == 4  # a move is not a use
    assert park(b, set().__contains__) == ["s", "q", "p"]  # in b's list, not parked


def test_transfer_of_a_plain_list_keeps_the_order_and_unparks() -> None:
    a: RecencyList[str] = RecencyList()
    b: RecencyList[str] = RecencyList()
    a.add_all(["p", "q", "r"])
    park(a, {"p"}.__contains__)
    a.transfer(["p", "r"], b)
    assert a.ordered() == ["q"] and b.ordered() == ["p", "r"]
    b.release("p")  # p is no longer parked anywhere: nothing to release
    assert park(b, set().__contains__) == ["p", "r"]


def _k(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def test_a_demoted_block_competes_by_its_old_last_use() -> None:
    """At share 0 the older of the two lists' coldest blocks goes: a block demoted to
    probation's hot end is older than the protected blocks reused after it."""
    policy = AdaptivePolicy(4)  # protected holds 3
    a, b, c, d = (_k(i) for i in range(4))
    policy.add_all([a, b, c, d])
    policy.release_all([a, b, c, d])
    policy.touch_all([a, b, c, d], set())  # a, b, c, d promoted; a demoted by d
    assert policy._probation.ordered() == [a] and policy._protected.ordered() == [b, c, d]
    policy._share_cap = 0  # as a decision for share 0 sets it
    never: Callable[[BlockHash], bool] = lambda key: False  # noqa: E731
    assert policy.choose_victims(4, never, (), []) == [a, b, c, d]
    policy.touch(b, True)  # b is now the most recent of all
    assert policy.choose_victims(4, never, (), []) == [a, c, d, b]
