"""ARC's own behaviour: T1/T2 promotion, ghosts, adaptation of p, ghost bounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.scheduler.policies import ARCPolicy


def k(i: int) -> bytes:
    return f"k{i}".encode()


def never_held(key: bytes) -> bool:
    return False


def fill(policy: ARCPolicy, ids: range) -> None:
    for i in ids:
        policy.add(k(i))
        policy.release(k(i))


def evict_one(policy: ARCPolicy, incoming: list[bytes] | None = None) -> bytes:
    victims = policy.choose_victims(1, never_held, (), incoming or [])
    assert victims is not None
    policy.evict(victims)
    return victims[0]


def test_second_use_moves_t1_to_t2() -> None:
    arc = ARCPolicy(4)
    fill(arc, range(2))
    arc.touch(k(0), reused=True)
    assert arc.sizes == (1, 1, 0, 0)
    arc.touch(k(0), reused=True)
    assert arc.sizes == (1, 1, 0, 0)


def test_evicted_blocks_become_ghosts_and_a_returning_ghost_grows_p() -> None:
    arc = ARCPolicy(2)
    fill(arc, range(2))
    assert evict_one(arc) == k(0)  # T1's coldest; p = 0 < |T1|
    assert arc.sizes == (1, 0, 1, 0)
    arc.add(k(0))  # ghost hit in B1: T1 was too small
    assert arc.p == 1
    assert arc.sizes == (1, 1, 0, 0), "a returning ghost goes to T2"


def test_b2_ghost_shrinks_p() -> None:
    arc = ARCPolicy(2)
    fill(arc, range(2))
    arc.touch(k(0), reused=True)  # T1 = {1}, T2 = {0}
    arc.p = 2  # prefer evicting from T2
    assert evict_one(arc) == k(0)
    assert arc.sizes == (1, 0, 0, 1)
    arc.add(k(0))
    assert arc.p == 1


def test_choose_victims_changes_nothing_until_evict() -> None:
    arc = ARCPolicy(3)
    fill(arc, range(3))
    before = (arc.sizes, arc.p)
    assert arc.choose_victims(2, never_held, (), [k(9)]) == [k(0), k(1)]
    assert arc.choose_victims(4, never_held, (), []) is None
    assert (arc.sizes, arc.p) == before


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("atE"), st.integers(0, 20)), max_size=120))
def test_ghost_lists_stay_bounded(ops: list[tuple[str, int]]) -> None:
    c = 4
    arc = ARCPolicy(c)
    resident: set[bytes] = set()
    for op, i in ops:
        key = k(i)
        if op == "a" and key not in resident:
            if len(resident) == c:
                resident.discard(evict_one(arc, [key]))
            arc.add(key)
            arc.release(key)
            resident.add(key)
        elif op == "t":
            arc.touch(key, reused=True)
        elif op == "E" and resident:
            resident.discard(evict_one(arc))
        t1, t2, b1, b2 = arc.sizes
        assert t1 + t2 == len(resident) <= c
        assert t1 + b1 <= c
        assert t1 + t2 + b1 + b2 <= 2 * c
        assert 0 <= arc.p <= c


def test_a_returning_ghost_in_a_store_that_evicts_goes_to_t2() -> None:
    # choose_victims sees the ghost among the incoming keys: add_all must look too.
    arc = ARCPolicy(4)
    fill(arc, range(4))
    assert evict_one(arc) == k(0)  # k0 a ghost of B1; T1 = {k1, k2, k3}
    incoming = [k(0)]
    victims = arc.choose_victims(1, never_held, (), incoming)
    assert victims == [k(1)]  # p would be 1 < |T1|
    arc.evict(victims)
    arc.add_all(incoming)
    assert arc.sizes == (2, 1, 1, 0) and arc.p == 1


def test_add_all_looks_up_ghosts_again_after_an_add_in_between() -> None:
    # The batch choose_victims found ghost-free is forgotten by an ``add``: a key of
    # it added then and evicted is a ghost by the time the batch is added.
    arc = ARCPolicy(4)
    fill(arc, range(2))
    incoming = [k(5)]
    assert arc.choose_victims(1, never_held, (), incoming) == [k(0)]
    fill(arc, range(5, 6))  # k5 added: T1 = {k0, k1, k5}
    arc.evict([k(5)])  # k5 a ghost of B1
    arc.add_all(incoming)
    assert arc.sizes == (2, 1, 0, 0) and arc.p == 1, "the returning ghost goes to T2"


def test_add_all_forgets_the_ghost_free_batch_once_added() -> None:
    arc = ARCPolicy(4)
    fill(arc, range(2))
    incoming = [k(5)]
    assert arc.choose_victims(1, never_held, (), incoming) == [k(0)]
    arc.evict([k(0)])
    arc.add_all(incoming)
    arc.release_all(incoming)
    arc.evict([k(5)])  # k5 now a ghost of B1 = {k0, k5}
    arc.add_all(incoming)  # the same list again: its key is a ghost now
    assert arc.sizes == (1, 1, 1, 0) and arc.p == 1
