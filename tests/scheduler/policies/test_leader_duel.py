"""The leader policy's shadows and decisions, at every start and with a margin.

``test_leader.py`` compares the tier with ``LeaderModel`` at the shipped start (LRU)
and margin (0). A margin and another start make the scores' exact values matter: a
constant added to every score no longer cancels (with a margin of 0.3, hits of 3 for
the leader and 4 for a challenger hand the lead on, but not with 1 added to each). So
the decisions here pin the scoring itself: hits reset each window, decay, the margin,
ties keeping the leader. Each shadow is also compared alone with the model's, request
by request. Written for the mutants of ``leader.py`` that survived
``scripts/mutate.sh policies``.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import LeaderPolicy, leader, make_policy
from kvtier.scheduler.policies.shadow import ShadowTier
from kvtier.scheduler.serve import serve_request
from tests.budget import examples

from .models import CANDIDATE_MODELS, CANDIDATE_NAMES, LeaderModel, _ShadowModel
from .twins import block_key, manager_for, serve


def _never_held(key: BlockHash) -> bool:
    return False


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("capacity", [1, 2, 3, 5])
def test_each_shadow_serves_a_request_as_its_model_does(index: int, capacity: int) -> None:
    shadow = ShadowTier(leader.CANDIDATES[index], capacity)
    model = _ShadowModel(CANDIDATE_MODELS[index](capacity))
    rng = random.Random(capacity * 3 + index)
    for _ in range(300):
        keys = [block_key(rng.randrange(2 * capacity + 3)) for _ in range(rng.randint(1, 5))]
        serve_request(shadow, keys)
        last = shadow.last
        done = ([], []) if last is None else (last.block_hashes_evicted, last.block_hashes_to_store)
        assert done == model.serve(keys)
        assert shadow.hits == model.hits
        assert shadow.resident == set(model.resident)


def _run(
    monkeypatch: pytest.MonkeyPatch,
    capacity: int,
    start: int,
    window: int,
    margin: float,
    reqs: list[tuple[list[int], bool, bool]],
    early: float = math.inf,
    significance: float = 0.0,
) -> list[str]:
    """Serve ``reqs`` through two managers, over the policy and over its model; after
    every request compare hits, stores, the leader, list sizes and eviction order."""
    monkeypatch.setattr(leader, "START", start)
    monkeypatch.setattr(leader, "WINDOW_MIN", window)
    monkeypatch.setattr(leader, "MARGIN", margin)
    monkeypatch.setattr(leader, "EARLY", early)
    monkeypatch.setattr(leader, "SIGNIFICANCE", significance)
    policy = make_policy("leader", capacity)
    assert isinstance(policy, LeaderPolicy)
    model = LeaderModel(
        capacity,
        start=start,
        window=window,
        decay=leader.DECAY,
        margin=margin,
        early=early,
        significance=significance,
        reserve=leader.RESERVE,
        scan=leader.RESERVE_SCAN,
    )
    real, twin = manager_for(policy, capacity), manager_for(model, capacity)
    leaders: list[str] = []
    for ids, load, ok in reqs:
        keys, hit = serve(real, twin, ids, load, ok)
        if load and hit:
            for m in (real, twin):
                m.complete_load(keys[:hit])
        assert policy.leader == CANDIDATE_NAMES[model.leader]
        assert policy.follows == model.follows
        assert policy.sizes == model.sizes
        n = len(policy)
        if n:
            assert policy.choose_victims(n, _never_held, (), ()) == model.choose_victims(
                n, _never_held, (), ()
            )
        leaders.append(policy.leader)
    return leaders


def _random_requests(seed: int, n: int, keys: int) -> list[tuple[list[int], bool, bool]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(keys) for _ in range(rng.randint(1, 5))],
            rng.random() < 0.2,
            rng.random() < 0.9,
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("significance", [0.0, 1.0])
@pytest.mark.parametrize("early", [math.inf, 1.0])
@pytest.mark.parametrize("margin", [0.0, 0.3, 0.9])
@pytest.mark.parametrize("start", [0, 1, 2])
def test_the_tier_follows_its_model_from_any_start_with_any_margin(
    monkeypatch: pytest.MonkeyPatch, start: int, margin: float, early: float, significance: float
) -> None:
    seen: set[str] = set()
    for seed, capacity, window in ((1, 4, 6), (2, 6, 9), (3, 3, 4), (4, 8, 16)):
        reqs = _random_requests(seed, 250, 3 * capacity)
        seen.update(_run(monkeypatch, capacity, start, window, margin, reqs, early, significance))
    assert len(seen) >= 2  # the lead did change hands


requests = st.lists(
    st.tuples(st.lists(st.integers(0, 15), min_size=1, max_size=5), st.booleans(), st.booleans()),
    max_size=60,
)


@settings(max_examples=examples(100), deadline=None)
@given(
    capacity=st.integers(1, 8),
    start=st.integers(0, 2),
    window=st.integers(1, 12),
    margin=st.sampled_from([0.0, 0.3, 0.9]),
    early=st.sampled_from([math.inf, 4.0, 1.0, 0.5]),
    significance=st.sampled_from([math.inf, 1.0, 0.5, 0.0]),
    reqs=requests,
)
def test_the_tier_follows_its_model_on_any_requests(
    capacity: int,
    start: int,
    window: int,
    margin: float,
    early: float,
    significance: float,
    reqs: list[tuple[list[int], bool, bool]],
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _run(
            mp,
            capacity,
            start,
            window,
            margin,
            reqs,
            early,
            significance,
        )


def test_a_tie_keeps_the_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing but misses: every score stays 0, and a tie never hands the lead on."""
    reqs = [([i], False, True) for i in range(40)]
    assert set(_run(monkeypatch, 4, 1, 5, 0.0, reqs)) == {"arc"}
    assert set(_run(monkeypatch, 4, 2, 5, 0.0, reqs)) == {"slru"}
