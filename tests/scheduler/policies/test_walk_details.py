"""The slow walks of ``RecencyList`` and ARC: parking order, parking cost, the T1 count.

Each test here was written for a mutant that survived ``scripts/mutate.sh policies``:
a search that parks nothing but still returns the right victims, parked
blocks listed by key instead of by parking order, ARC's walk miscounting T1, and
ARC's batch touch with a ``storing`` that is not a set. Each names the exact victims,
in order, worked out by hand, and checks them against the plain reference model too.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import ARCPolicy
from kvtier.scheduler.policies.recency import RecencyList

from .models import ARCModel


def k(name: str) -> BlockHash:
    return BlockHash(name.encode())


def never_held(key: BlockHash) -> bool:
    return False


def search(rl: RecencyList[str], is_held: Callable[[str], bool]) -> list[str]:
    gen = rl.evictable(is_held, ())
    try:
        return list(gen)
    finally:
        gen.close()


def test_parked_keys_are_listed_by_parking_order_not_by_key() -> None:
    rl: RecencyList[str] = RecencyList()
    for key in ("5", "3", "9", "1"):
        rl.add(key)
    held = {"5", "3", "9"}
    assert search(rl, held.__contains__) == ["1"]  # parks 5, then 3, then 9
    assert rl.ordered() == ["5", "3", "9", "1"]
    assert rl.first() == "5"


def test_a_second_search_does_not_walk_past_the_parked_blocks_again() -> None:
    """Eviction cost is proportional to the blocks evicted, not to the blocks pinned:
    the first search parks the held run at the cold end, later ones never see it."""
    rl: RecencyList[str] = RecencyList()
    pinned = [f"p{i}" for i in range(100)]
    rl.add_all(pinned)
    rl.add("free")
    asked: list[str] = []

    def is_held(key: str) -> bool:
        asked.append(key)
        return key in pinned

    assert search(rl, is_held) == ["free"]
    assert asked[:100] == pinned  # each pinned block asked about once, in order
    asked.clear()
    assert rl.coldest(1, is_held, ()) == ["free"]
    assert asked == ["free"]
    asked.clear()
    assert search(rl, is_held) == ["free"]
    assert len(asked) <= 2 and set(asked) == {"free"}
    assert rl.ordered() == [*pinned, "free"]


def _arc_with_a_held_t1_block(p: int) -> tuple[ARCPolicy, ARCModel, set[BlockHash]]:
    """T1 = [h, a, b, c, d] with h held, T2 = [x, y] with y held; ``p`` set."""
    arc, model = ARCPolicy(8), ARCModel(8)
    for policy in (arc, model):
        for name in ("x", "y", "h", "a", "b", "c", "d"):
            policy.add(k(name))
            policy.release(k(name))
        policy.touch(k("x"), True)
        policy.touch(k("y"), True)
    arc.p = model.p = p
    assert arc.sizes == model.sizes == (5, 2, 0, 0)
    return arc, model, {k("h"), k("y")}


def test_arc_walk_takes_t1_down_to_p_counting_held_blocks_then_t2_then_falls_back() -> None:
    # |T1| = 5 > p = 2: T1 gives 3 (a, b, c; the held h counts towards |T1|), then T2's
    # only evictable block, then back to T1 (d) once T2 has nothing left. T2 runs out,
    # so the fast path gives up and this is the walk.
    arc, model, held = _arc_with_a_held_t1_block(p=2)
    want = [k(n) for n in ("a", "b", "c", "x", "d")]
    assert model.choose_victims(5, held.__contains__, (), ()) == want
    assert arc.choose_victims(5, held.__contains__, (), ()) == want
    assert arc.choose_victims(6, held.__contains__, (), ()) is None


def test_arc_walk_with_t1_short_of_its_share_falls_back_to_t2() -> None:
    # p = 1: T1 should give 4 but has 4 evictable only with h: a, b, c, d, then T2.
    arc, model, held = _arc_with_a_held_t1_block(p=1)
    want = [k(n) for n in ("a", "b", "c", "d", "x")]
    assert model.choose_victims(5, held.__contains__, (), ()) == want
    assert arc.choose_victims(5, held.__contains__, (), ()) == want
    # p = 3: T1 gives 2 (|T1| 5 -> 3), then T2's x, then T1 again (c, d).
    arc, model, held = _arc_with_a_held_t1_block(p=3)
    want = [k(n) for n in ("a", "b", "x", "c", "d")]
    assert model.choose_victims(5, held.__contains__, (), ()) == want
    assert arc.choose_victims(5, held.__contains__, (), ()) == want


def test_arc_touch_all_takes_any_collection_as_storing() -> None:
    """``storing`` is a ``Collection``: a list or a tuple must work as a set does."""
    for storing in ([], (), [k("b")], frozenset({k("b")})):
        arc, oracle = ARCPolicy(4), ARCPolicy(4)
        for policy in (arc, oracle):
            policy.add_all([k("a"), k("b"), k("c")])
            policy.release_all([k("a"), k("b"), k("c")])
        arc.touch_all([k("b"), k("a")], storing)
        for key in (k("b"), k("a")):
            oracle.touch(key, key not in storing)
        assert arc.sizes == oracle.sizes
        everything = arc.choose_victims(3, never_held, (), ())
        assert everything == oracle.choose_victims(3, never_held, (), ())
        # b reused: T1 = [c], T2 = [b, a]; b only recency: T1 = [c, b], T2 = [a]
        assert arc.sizes == ((1, 2, 0, 0) if k("b") not in storing else (2, 1, 0, 0))
        assert everything == [k("c"), k("b"), k("a")]
