"""The ``density`` policy: its history, its tables, its model, and what it learns.

``test_reference_models.py`` checks it against ``DensityModel`` step by step, but with
its real constants no table is ever recomputed there (4,096 looked-up keys between
updates). Here the constants are shrunk so that tables are recomputed every few keys
and the history forgets after a few, and requests follow prefix chains, so that
generations, shared prefixes, dead classes and the no-evidence rule all happen.
"""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash, Medium
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import density, hit_density, make_policy
from kvtier.scheduler.policies.density import SHARED, DensityPolicy, chain_class
from kvtier.scheduler.policies.hit_density import BUCKETS, HitDensity
from kvtier.scheduler.policies.prefix_history import PrefixHistory
from kvtier.scheduler.serve import serve_request
from kvtier.sim.replay import replay
from kvtier.sim.trace import trace_from_requests
from tests.budget import examples

from .density_model import DensityModel, density_model


def k(i: int) -> BlockHash:
    return BlockHash(f"k{i}".encode())


def keys(*ids: int) -> list[BlockHash]:
    return [k(i) for i in ids]


# -- PrefixHistory -------------------------------------------------------------------


def test_generation_counts_the_requests_that_extended_a_chain() -> None:
    history = PrefixHistory(limit=100)
    assert history.classify(keys(1, 2)) == (0, -1)  # nothing known
    assert history.classify(keys(1, 2, 3)) == (1, -1)  # extends generation 0
    assert history.classify(keys(1, 2, 3, 4, 5)) == (2, -1)
    assert history.classify(keys(1, 2, 3)) == (2, -1)  # a repeat: its deepest key (3: 1) + 1
    # Known keys keep the generation of the request that first saw them.
    assert [history.generation(key) for key in keys(1, 2, 3, 4, 5, 6)] == [0, 0, 1, 2, 2, None]


def test_a_branching_point_shares_itself_and_every_key_before_it() -> None:
    history = PrefixHistory(limit=100)
    history.classify(keys(1, 2, 3, 4))
    # 2 is now followed by 3 and by 9: a branching point; 1 and 2 are shared.
    assert history.classify(keys(1, 2, 9)) == (1, 1)
    # Later requests through 2 share it too, even when they follow a known branch.
    assert history.classify(keys(1, 2, 3, 4, 5)) == (1, 1)
    # A request that merely ends at a key does not branch it.
    assert history.classify(keys(1, 2, 3)) == (1, 1)
    history.classify(keys(7, 8))
    assert history.classify(keys(7)) == (1, -1)


def test_the_history_forgets_but_stays_bounded() -> None:
    history = PrefixHistory(limit=4)
    for i in range(0, 40, 2):
        history.classify(keys(i, i + 1))
        assert len(history) <= 2 * 4 + 2
    assert k(38) in history and k(0) not in history
    assert history.classify(keys(0, 1)) == (0, -1)  # forgotten: a new chain again


# -- HitDensity ------------------------------------------------------------------------


def test_density_is_later_hits_over_later_time_per_bucket() -> None:
    table = HitDensity(classes=2, width=10)
    table.hit(0, 5)  # bucket 0
    table.hit(0, 25)  # bucket 2
    table.evicted(0, 31)  # bucket 3
    table.update()
    # One class with events: the pool is its own counts, and shrinking toward it
    # scales every count alike, so the densities are its own.
    # Bucket 0: hits after 2; time: (0-0+1)*1 + (2-0+1)*1 + (3-0+1)*1 = 8.
    assert table.density(0, 0) == pytest.approx(2 / 8, rel=1e-12)
    # Bucket 1: hits 1; time (2-1+1) + (3-1+1) = 5.  Bucket 3: 0 hits over 1.
    assert table.density(0, 15) == pytest.approx(1 / 5, rel=1e-12)
    assert table.density(0, 35) == 0.0
    assert table.density(0, 10 * BUCKETS * 3) == 0.0  # past the last bucket: its value
    assert table.density(1, 0) == pytest.approx(2 / 8, rel=1e-12)  # no events: the pool's


def test_counts_decay_at_each_update() -> None:
    table = HitDensity(classes=1, width=1)
    table.hit(0, 0)
    table.evicted(0, 0)
    table.update()
    assert table.density(0, 0) == pytest.approx(1 / 2, rel=1e-12)
    table.evicted(0, 0)  # the old counts now weigh DECAY each
    table.update()
    d = hit_density.DECAY
    assert table.density(0, 0) == pytest.approx(d / (2 * d + 1), rel=1e-12)


def test_classes_are_shrunk_toward_the_pool_and_one_without_events_is_the_pool() -> None:
    """Regression: a class first used after an update had an all-zero table and was
    dead, so its blocks went first and it never showed a hit (mixed workloads lost
    thousands of blocks at 5 %)."""
    table = HitDensity(classes=3, width=1)
    table.hit(0, 0)
    table.evicted(1, 0)
    table.update()
    # The pool: 1 hit and 1 eviction at age 0; PRIOR_EVENTS = 20 of it, 10 and 10,
    # are added to each class's own counts.
    assert hit_density.PRIOR_EVENTS == 20.0
    assert table.rank(0, 0) == pytest.approx((11 / 21, True, 0, 11 / 21))
    assert table.rank(1, 0) == pytest.approx((10 / 21, True, 0, 10 / 21))
    assert table.rank(2, 0) == pytest.approx((1 / 2, True, 0, 1 / 2))  # no events: the pool
    assert table.alive_floor == pytest.approx(hit_density.DEAD_SHARE * 11 / 21)


def test_tables_survive_a_long_stretch_without_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: with no hit or eviction for ~23,000 updates the decayed counts
    reached the smallest floats, ``PRIOR_EVENTS / pool`` overflowed and every table
    became all-zero (an idle tier whose clock runs on: a remote tier after an outage).
    A DECAY of 0.5 gets there in ~1,080 updates."""
    monkeypatch.setattr(hit_density, "DECAY", 0.5)
    table = HitDensity(classes=2, width=1)
    table.hit(0, 0)
    table.evicted(0, 3)
    table.update()
    learned = [table.rank(c, a) for c in (0, 1) for a in range(5)]
    for _ in range(1100):
        table.update()
    assert [table.rank(c, a) for c in (0, 1) for a in range(5)] == learned
    assert table.density(0, 0) > 0


def test_until_anything_happens_every_class_ranks_by_age() -> None:
    table = HitDensity(classes=2, width=2)
    table.update()
    assert table.rank(1, 5) == (1 / 3, True, -5, 1.0)  # bucket 2: 1 / (2 + 1)


# -- the policy ------------------------------------------------------------------------


def _serve(manager: TierManager, ids: list[int]) -> int:
    """The replay's flow for one request; returns its prefix hit."""
    return serve_request(manager, keys(*ids))


def test_chain_classes_count_generation_depth_and_tail() -> None:
    assert chain_class(0, 0, tail=False) == 1 and chain_class(0, 0, tail=True) == 0
    assert chain_class(0, 1, tail=False) == 1  # depths 0 and 1 share a bucket
    assert chain_class(0, 2, tail=False) == 3 and chain_class(0, 7, tail=False) == 3
    assert chain_class(0, 8, tail=False) == 5 and chain_class(0, 10**6, tail=False) == 5
    assert chain_class(15, 0, tail=True) == 15 * 6
    assert chain_class(16, 0, tail=True) == chain_class(17, 0, tail=True) == 16 * 6
    assert chain_class(18, 0, tail=True) == 17 * 6
    assert chain_class(24, 0, tail=True) == chain_class(10**6, 0, tail=True) == 20 * 6
    assert SHARED == 21 * 6  # after every chain class


def test_blocks_take_their_requests_class_and_shared_prefixes_their_own() -> None:
    policy = DensityPolicy(64)
    manager = TierManager(medium=Medium.CPU, num_blocks=64, block_size=16, policy=policy)
    _serve(manager, [1, 2, 3])  # generation 0, hit depth 0
    assert [policy.class_of(key) for key in keys(1, 2, 3)] == [1, 1, 0]  # 3: the tail
    _serve(manager, [1, 2, 3, 4])  # generation 1, hit depth 3
    body, tail = chain_class(1, 3, tail=False), chain_class(1, 3, tail=True)
    assert [policy.class_of(key) for key in keys(1, 2, 3, 4)] == [body, body, body, tail]
    _serve(manager, [1, 2, 5])  # 2 branches: 1 and 2 shared; 5 is generation 1, depth 2
    assert [policy.class_of(key) for key in keys(1, 2, 5)] == [
        SHARED,
        SHARED,
        chain_class(1, 2, tail=True),
    ]
    assert [policy.class_of(key) for key in keys(3, 4)] == [body, tail]  # not looked up since


def test_the_blocks_of_chains_that_end_go_first() -> None:
    """Chains that always end at their second turn: once that is learned, the blocks
    of a finished chain go before older blocks of chains still going on."""
    with mock.patch.object(density, "UPDATE_KEYS", 8):
        policy = DensityPolicy(12)
        manager = TierManager(medium=Medium.CPU, num_blocks=12, block_size=16, policy=policy)
        for chain in range(100, 4100, 10):  # 400 chains of two turns, never seen again
            _serve(manager, [chain, chain + 1])
            _serve(manager, [chain, chain + 1, chain + 2])
        # The second turns' classes (generation 1, hit depth 2) are dead; the first
        # turns' (generation 0) are not: every first turn was continued, and its hits
        # were counted.
        second = {chain_class(1, 2, tail=False), chain_class(1, 2, tail=True)}
        for cls in second:
            assert policy._density.rank(cls, 0)[1] is False
        for tail in (False, True):
            assert policy._density.rank(chain_class(0, 0, tail), 0)[1] is True
        _serve(manager, [9000, 9001])  # new chains: their first turns, generation 0
        _serve(manager, [9010, 9011])
        _serve(manager, [9020, 9021])
        # The coldest blocks are second turns stored long before 9000..9021, and each
        # class's coldest is compared: a finished chain's blocks go, the new
        # chains' stay.
        victims = policy.choose_victims(3, lambda key: False, (), [])
        assert victims is not None
        assert {policy.class_of(key) for key in victims} <= second
        assert not set(victims) & set(keys(9000, 9001, 9010, 9011, 9020, 9021))


def test_replay_figures_of_a_chat_where_conversations_end() -> None:
    """Exact hits on a seeded chat trace -- 16 chats open at once on one shared
    2-block prompt, each turn 2 new blocks, every chat ending after its 4th turn --
    at 64 blocks: LRU and ARC keep finished chats, ``density`` learns that a 4th
    turn is never continued (deterministic; recorded when the policy was written)."""
    rng = random.Random(1)
    fresh = iter(range(10, 1_000_000))
    chats: list[tuple[list[int], int]] = []
    rows = []
    for n in range(3000):
        while len(chats) < 16:
            chats.append(([0, 1, next(fresh)], 0))
        i = rng.randrange(len(chats))
        history, turns = chats[i]
        history = [*history, next(fresh), next(fresh)]
        rows.append((n, len(history) * 16, 1, history))
        if turns + 1 == 4:
            chats.pop(i)
        else:
            chats[i] = (history, turns + 1)
    trace = trace_from_requests(rows, block_size=16, source="chats of four turns")
    hits = {name: replay(trace, 64, name).ratios.hit_blocks for name in ("lru", "arc", "density")}
    assert hits == {"lru": 12354, "arc": 11710, "density": 14293}


# -- against the model, with tables recomputed every few keys -------------------------

chains = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(1, 3)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(capacity=st.integers(1, 10), requests=chains, update=st.integers(3, 9))
def test_density_matches_its_model_while_it_learns(
    capacity: int, requests: list[tuple[int, int, int]], update: int
) -> None:
    """Requests on six chains (each a prefix of its chain plus new blocks, some on a
    shared two-block prompt), through a real manager over the policy and one over
    the model: the same hits and the same stores and evictions, request by request."""
    with (
        mock.patch.object(density, "UPDATE_KEYS", update),
        mock.patch.object(density, "HISTORY", 1),
        mock.patch.object(hit_density, "BUCKETS", 6),  # the model's sums are quadratic
    ):
        real = TierManager(
            medium=Medium.CPU,
            num_blocks=capacity,
            block_size=16,
            policy=make_policy("density", capacity),
        )
        model = TierManager(
            medium=Medium.CPU,
            num_blocks=capacity,
            block_size=16,
            policy=density_model(capacity),
        )
        grown: dict[int, list[int]] = {}
        fresh = iter(range(1000, 10_000))
        for chain, keep, extra in requests:
            base = grown.get(chain, [0, 1] if chain % 2 else [])
            ids = base[: len(base) - keep if keep < len(base) else len(base)]
            ids = ids + [next(fresh) for _ in range(extra)]
            grown[chain] = ids
            request = keys(*ids)
            hits = [manager.lookup(request) for manager in (real, model)]
            assert hits[0] == hits[1]
            outs = []
            for manager in (real, model):
                manager.touch(request)
                outs.append(manager.prepare_store(request[hits[0] :]))
            assert outs[0] == outs[1]
            for manager, out in zip((real, model), outs, strict=True):
                manager.touch(request)
                if out is not None:
                    manager.complete_store(out.block_hashes_to_store)
            policy = real.policy
            assert isinstance(policy, DensityPolicy)
            # nothing kept for a block the tier no longer holds (``_last`` leaked once)
            listed = set().union(*(listing.keys() for listing in policy._lists))
            assert set(policy._last) == set(policy._class) == listed == set(real.keys())


# -- against the model, call by call ------------------------------------------------

calls = st.lists(
    st.tuples(
        st.sampled_from(["lookup", "store", "touch"]),
        st.lists(st.integers(0, 11), min_size=1, max_size=7),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(capacity=st.integers(2, 8), calls=calls, update=st.integers(3, 9))
def test_density_matches_its_model_call_by_call(
    capacity: int, calls: list[tuple[str, list[int]]], update: int
) -> None:
    """The policy and its model driven directly, in any order the manager's protocol
    allows: lookups that no touch follows, requests that repeat a key, resident keys
    after a missing one. After every call the two hold the same hit and eviction
    counts (floats, exactly), the same last-use times and classes, and choose the same
    victims. (The manager-driven test above always touches after a lookup, so it
    cannot see a lookup that forgets to make its hits' last use ``now``.)"""
    with (
        mock.patch.object(density, "UPDATE_KEYS", update),
        mock.patch.object(density, "HISTORY", 1),
        mock.patch.object(hit_density, "BUCKETS", 6),
    ):
        real = make_policy("density", capacity)
        model = density_model(capacity)
        assert isinstance(real, DensityPolicy)
        assert isinstance(model, DensityModel)
        for call, ids in calls:
            request = keys(*ids)
            if call == "lookup":
                real.observe(request)
                model.observe(request)
            elif call == "touch":
                used = [key for key in request if key in model]
                real.touch_all(used, ())
                for key in used:
                    model.touch(key, reused=True)
            else:
                new = [key for key in dict.fromkeys(request) if key not in model][:capacity]
                need = len(model) + len(new) - capacity
                if need > 0:
                    victims = real.choose_victims(need, _never_held, set(request), new)
                    assert victims == model.choose_victims(need, _never_held, set(request), new)
                    if victims is None:
                        continue
                    real.evict(victims)
                    model.evict(victims)
                real.add_all(new)
                for key in new:
                    model.add(key)
            assert real._density._hits == model.hits
            assert real._density._evictions == model.evictions
            assert real._last == model.time
            assert {key: real.class_of(key) for key in real._class} == model.cls


def _never_held(key: BlockHash) -> bool:
    return False
