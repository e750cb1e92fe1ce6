"""Tests written for survivors of the mutation run on ``recency.py`` and ``timed.py``.

Each test names the mutant it kills; the equivalent survivors, with their reasons, are
in ``docs/survivors-sv1.md``.
"""

from __future__ import annotations

import itertools

from kvtier.scheduler.policies.timed import TimedRecencyList


def test_timed_touch_all_moves_the_touched_keys_to_the_hot_end() -> None:
    """``TimedRecencyList.touch_all``'s fast path (nothing parked) must move the keys,
    not only stamp them: a touched key is no longer the coldest, so it is not the next
    victim. Kills ``touch_all`` with ``deque(maxlen=0)`` (the ``map`` of moves dropped),
    which left the order as it was and the old coldest as the victim."""
    clock = itertools.count()
    rl: TimedRecencyList[str] = TimedRecencyList(clock)
    rl.add_all(["a", "b", "c"])  # 0, 1, 2
    rl.touch_all(["a", "b"])  # 3, 4
    assert rl.ordered() == ["c", "a", "b"]
    assert {key: rl.time(key) for key in rl.ordered()} == {"c": 2, "a": 3, "b": 4}
    assert rl.first() == "c"
    assert rl.coldest(2, lambda key: False, ()) == ["c", "a"]
    assert next(clock) == 5
