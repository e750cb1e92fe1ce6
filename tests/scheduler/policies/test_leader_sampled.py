"""The leader policy on large tiers: sampled shadows, the tier in a real instance.

Tiers of ``sampling.FULL_SHADOWS_BELOW`` blocks or more feed their shadows 1 request
in R (``sampling.sample_rate``) and keep their blocks in a real instance of the
leading policy, rebuilt at the next search for victims after a switch. The tests
shrink the sampling thresholds so that tiers of a few blocks sample, and compare the
tier, request by request, with ``LeaderModel`` at the same rate through real
managers (pins, failed stores, decisions every few keys).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import LeaderPolicy, leader, make_policy, sampling
from kvtier.sim.replay import replay
from kvtier.sim.workload import generate, shaped
from tests.budget import examples

from .models import CANDIDATE_NAMES, LeaderModel
from .twins import block_key, manager_for, serve, serve_one


def _small_samples(mp: pytest.MonkeyPatch) -> None:
    """Tiers of 4 blocks or more sample, each shadow holding at least 2 keys."""
    mp.setattr(sampling, "FULL_SHADOWS_BELOW", 4)
    mp.setattr(sampling, "SAMPLED_SHADOW_BLOCKS", 2)


@pytest.mark.parametrize(
    ("capacity", "rate"), [(65535, 1), (65536, 8), (200_000, 16), (2**23, 256)]
)
def test_large_tiers_sample_their_shadows_as_adaptive_does(capacity: int, rate: int) -> None:
    policy = LeaderPolicy(capacity)
    assert policy.sample_rate == rate == sampling.sample_rate(capacity)
    # a sampled leader runs no shadow of the in-step-only candidates (density)
    shadows = len(leader.CANDIDATES) - (len(leader.IN_STEP_ONLY) if rate > 1 else 0)
    assert [s.capacity for s in policy._shadows] == [capacity // rate] * shadows
    names = [s.policy.name for s in policy._shadows]
    assert ("density" in names) == (rate == 1)


@pytest.mark.parametrize(("start", "name"), list(enumerate(("lru", "arc", "slru"))))
def test_a_sampled_leader_that_never_changes_is_exactly_that_policy(
    monkeypatch: pytest.MonkeyPatch, start: int, name: str
) -> None:
    """The tier is a real instance of its leader's policy: the same hits."""
    _small_samples(monkeypatch)
    monkeypatch.setattr(leader, "START", start)
    monkeypatch.setattr(leader, "WINDOW_MIN", 10**12)  # never decides
    monkeypatch.setattr(leader, "EARLY", math.inf)  # not even early
    monkeypatch.setattr(leader, "SIGNIFICANCE", math.inf)  # nor on a significant lead
    trace = generate(replace(shaped("mixed", 7), requests=300))
    for capacity in (20, 150, 600):
        assert make_policy("leader", capacity).sample_rate > 1  # type: ignore[attr-defined]
        want = replay(trace, capacity, name).ratios.hit_blocks
        assert replay(trace, capacity, "leader").ratios.hit_blocks == want


def _run(
    mp: pytest.MonkeyPatch,
    capacity: int,
    start: int,
    window: int,
    reqs: list[tuple[list[int], bool, bool]],
    early: float = leader.EARLY,
    significance: float = leader.SIGNIFICANCE,
) -> list[str]:
    """Serve ``reqs`` through managers over the policy and over its model; after every
    request compare hits, stores, evictions, the leader, the policy the tier follows,
    its list sizes and its whole eviction order (as the manager sees held blocks)."""
    _small_samples(mp)
    mp.setattr(leader, "START", start)
    mp.setattr(leader, "WINDOW_MIN", window)
    mp.setattr(leader, "EARLY", early)
    mp.setattr(leader, "SIGNIFICANCE", significance)
    policy = make_policy("leader", capacity)
    assert isinstance(policy, LeaderPolicy)
    rate = policy.sample_rate
    assert rate > 1
    model = LeaderModel(
        capacity,
        start=start,
        window=window,
        decay=leader.DECAY,
        margin=leader.MARGIN,
        early=early,
        significance=significance,
        reserve=leader.RESERVE,
        scan=leader.RESERVE_SCAN,
        rate=rate,
    )
    real, twin = manager_for(policy, capacity), manager_for(model, capacity)
    follows: list[str] = []
    pinned: list[list[BlockHash]] = []
    for ids, load, ok in reqs:
        keys, hit = serve(real, twin, ids, load, ok)
        if load and hit:
            pinned.append(keys[:hit])
        if len(pinned) > 2 or (pinned and not load):  # loads finish a little later
            done = pinned.pop(0)
            for m in (real, twin):
                m.complete_load(done)
        assert policy.leader == CANDIDATE_NAMES[model.leader]
        assert len(policy) == len(model)
        n = len(policy) - sum(map(real._is_held, real._slots))
        if n:
            assert policy.choose_victims(n, real._is_held, (), ()) == model.choose_victims(
                n, twin._is_held, (), ()
            )
        assert policy.follows == model.follows
        assert policy.sizes == model.sizes
        follows.append(policy.follows)
    return follows


def _random_requests(seed: int, n: int, keys: int) -> list[tuple[list[int], bool, bool]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(keys) for _ in range(rng.randint(1, 5))],
            rng.random() < 0.3,
            rng.random() < 0.9,
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("start", [0, 1, 2])
def test_the_sampled_tier_follows_its_model_through_switches(
    monkeypatch: pytest.MonkeyPatch, start: int
) -> None:
    seen: set[str] = set()
    for seed, capacity, window in ((1, 4, 6), (2, 8, 9), (3, 6, 4), (4, 16, 16)):
        reqs = _random_requests(seed, 300, 3 * capacity)
        seen.update(_run(monkeypatch, capacity, start, window, reqs))
    assert len(seen) >= 2  # the tier did take on another policy


requests = st.lists(
    st.tuples(st.lists(st.integers(0, 23), min_size=1, max_size=5), st.booleans(), st.booleans()),
    max_size=60,
)


@settings(max_examples=examples(150), deadline=None)
@given(
    capacity=st.integers(4, 12),
    start=st.integers(0, 2),
    window=st.integers(1, 12),
    early=st.sampled_from([math.inf, 4.0, 1.0]),
    significance=st.sampled_from([math.inf, 1.0, 0.0]),
    reqs=requests,
)
def test_the_sampled_tier_follows_its_model_on_any_requests(
    capacity: int,
    start: int,
    window: int,
    early: float,
    significance: float,
    reqs: list[tuple[list[int], bool, bool]],
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _run(mp, capacity, start, window, reqs, early, significance)


def test_a_sampled_tier_takes_on_a_scan_resistant_leader_and_hits_more_than_lru(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six reused blocks between one-time scans: the sampled shadows hand the lead
    from LRU to ARC or SLRU, the tier's blocks move into that policy's instance, and
    the tier then hits more than LRU does."""
    monkeypatch.setattr(sampling, "FULL_SHADOWS_BELOW", 4)
    monkeypatch.setattr(sampling, "SAMPLED_SHADOW_BLOCKS", 8)
    monkeypatch.setattr(leader, "WINDOW_MIN", 1)
    policy = LeaderPolicy(32)
    assert policy.sample_rate == 4
    tier, lru = manager_for(policy, 32), manager_for(make_policy("lru", 32), 32)
    hits = {"leader": 0, "lru": 0}
    follows = []
    fresh = 1000
    reused = (2, 7, 8, 13, 17, 20)  # each sampled: crc32 of these keys is 0 mod 4
    for step in range(1200):
        if step % 2:
            ids = [reused[step // 2 % len(reused)]]
        else:
            ids = list(range(fresh, fresh + 6))
            fresh += 6
        hits["leader"] += serve_one(tier, ids)
        hits["lru"] += serve_one(lru, ids)
        follows.append(policy.follows)
    assert follows[0] == "lru" and follows[-1] != "lru"
    assert hits["leader"] > hits["lru"]


def test_a_switch_back_before_any_eviction_keeps_the_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lead goes to ARC and back to LRU before the tier evicts: the LRU instance
    the tier has is kept as it is (no rebuild, the order unchanged)."""
    _small_samples(monkeypatch)
    policy = LeaderPolicy(8)
    tier = policy._tier
    keys = [block_key(i) for i in range(8)]
    policy.add_all(keys)
    policy.touch_all(keys[:3], ())
    instance = tier.policy  # type: ignore[union-attr]
    tier.lead(policy._shadows[1])
    tier.lead(policy._shadows[0])
    assert policy.choose_victims(8, lambda key: key == keys[5], (), ()) is None
    assert tier.policy is instance  # type: ignore[union-attr]
    assert policy.choose_victims(7, lambda key: key == keys[5], (), ()) == [
        *keys[3:5],
        *keys[6:],
        *keys[:3],
    ]


def test_a_sampled_tier_ignores_a_touch_of_an_absent_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the in-step tier does, whichever policy leads (LRU's own list would raise)."""
    _small_samples(monkeypatch)
    policy = LeaderPolicy(8)
    policy.add_all([block_key(1), block_key(2)])
    policy.touch(block_key(9), True)
    policy.touch(block_key(1), True)
    assert policy.choose_victims(2, lambda key: False, (), ()) == [block_key(2), block_key(1)]


@pytest.mark.parametrize("to", [1, 2])
def test_a_rebuild_takes_every_block_parked_ones_included(
    monkeypatch: pytest.MonkeyPatch, to: int
) -> None:
    """The new instance gets the tier's blocks from the old instance itself (no set of
    them is kept beside it): the held ones, parked there by a search, first."""
    _small_samples(monkeypatch)
    policy = make_policy("leader", 8)
    assert isinstance(policy, LeaderPolicy) and policy.sample_rate > 1
    keys = [block_key(i) for i in range(8)]
    policy.add_all(keys)
    held = {keys[0], keys[1], keys[5]}
    assert policy.choose_victims(1, held.__contains__, (), ()) == [keys[2]]  # parks 0, 1
    policy._tier.lead(policy._shadows[to])
    victims = policy.choose_victims(5, held.__contains__, (), ())  # rebuilds, then asks
    assert policy.follows == CANDIDATE_NAMES[to]
    assert sorted(policy._tier.policy.keys()) == keys and len(policy) == 8
    assert victims == [keys[2], keys[3], keys[4], keys[6], keys[7]]
    policy.touch(keys[6], True)  # a reuse: to T2 / protected, the second segment
    assert keys[6] in policy._tier.policy and block_key(8) not in policy._tier.policy
    held.add(keys[6])  # held blocks in both segments
    policy._tier.lead(policy._shadows[0])  # back to lru: its instance from both segments
    victims = policy.choose_victims(4, held.__contains__, (), ())
    assert policy.follows == "lru"
    assert sorted(policy._tier.policy.keys()) == keys and len(policy) == 8
    assert victims == [keys[2], keys[3], keys[4], keys[7]]


def _rates() -> list[tuple[int, int]]:
    """Every sampling rate ``leader`` uses, with the largest tier up to 2**24 blocks
    that uses it (the rate only changes at powers of two)."""
    rates = {sampling.sample_rate(2**k): 2**k for k in range(4, 25)}
    return sorted(rates.items())


def test_every_rate_the_leader_uses_is_checked() -> None:
    assert [rate for rate, _ in _rates()] == [1, 8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize(("rate", "capacity"), _rates())
def test_the_inline_sampling_check_agrees_with_is_sampled(rate: int, capacity: int) -> None:
    """``LeaderPolicy.observe`` tests "sampled" inline (a CRC-32 of the first key
    against the mask) beside ``sampling.is_sampled``: the shadows see exactly the
    requests ``is_sampled`` names, for trace ids and SHA-256-sized keys alike."""
    policy = LeaderPolicy(capacity)
    assert policy.sample_rate == rate
    shadow = policy._shadows[0]  # every request here is new: a sampled one is stored
    rng = random.Random(rate)
    seen = []
    want = []
    for i in range(3000):
        size = 8 if i % 2 else 32
        keys = [BlockHash(rng.randbytes(size)) for _ in range(3)]
        before = len(shadow.resident)
        policy.observe(keys)
        seen.append(len(shadow.resident) > before)
        want.append(sampling.is_sampled(keys, rate - 1))
    assert seen == want
    assert sum(want) == 3000 if rate == 1 else 0 < sum(want) < 3000
