"""The leader's reserve: while the tier follows LRU and every shadow has hit alike, it
keeps blocks LRU evicted that ARC or SLRU hold (``leader.RESERVE``)."""

from __future__ import annotations

import random

import pytest

from kvtier.blocks import Medium
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import LeaderPolicy, leader, make_policy

from .twins import block_key, serve_one

CAPACITY = 12


def _prompt_then_one_offs(policy_name: str) -> tuple[list[int], LeaderPolicy | None]:
    """A one-block prompt asked three times, then 30 one-off requests (two new blocks
    each: every shadow misses them alike), then the prompt again. LRU has evicted it
    by then; ARC (in T2) and SLRU (protected) have not. Returns each request's hit."""
    policy = make_policy(policy_name, CAPACITY)
    manager = TierManager(medium=Medium.CPU, num_blocks=CAPACITY, block_size=16, policy=policy)
    hits = [serve_one(manager, [0]) for _ in range(3)]
    hits += [serve_one(manager, [100 + 2 * i, 101 + 2 * i]) for i in range(30)]
    hits.append(serve_one(manager, [0]))
    return hits, policy if isinstance(policy, LeaderPolicy) else None


def test_the_reserve_keeps_what_arc_keeps_while_the_shadows_tie() -> None:
    lru, _ = _prompt_then_one_offs("lru")
    arc, _ = _prompt_then_one_offs("arc")
    assert (lru[-1], arc[-1]) == (0, 1)  # the case: only the frequency shadows keep it
    hits, policy = _prompt_then_one_offs("leader")
    assert policy is not None and policy.leader == "lru"  # no switch: nothing told them apart
    assert hits == arc  # the tier kept the prompt in its reserve
    assert policy._tier.reserve == max(1, round(leader.RESERVE * CAPACITY))  # still kept


def test_without_the_reserve_the_tier_is_lru(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader, "RESERVE", 0.0)
    hits, policy = _prompt_then_one_offs("leader")
    assert policy is not None and policy._tier.reserve == 0
    assert hits == _prompt_then_one_offs("lru")[0]


def test_the_reserve_is_given_up_when_a_guard_hits_less_than_the_leader() -> None:
    """Random requests over 20 one-block keys: at the first request on which ARC or
    SLRU hits less than LRU (the leader), and not before, the reserve is given up, with
    its reuse counts."""
    rng = random.Random(1)
    policy = make_policy("leader", CAPACITY)
    assert isinstance(policy, LeaderPolicy)
    manager = TierManager(medium=Medium.CPU, num_blocks=CAPACITY, block_size=16, policy=policy)
    shadows = [
        s for name in ("lru", "arc", "slru") for s in policy._shadows if s.policy.name == name
    ]
    for request in range(60):
        ids = list(dict.fromkeys(rng.randrange(20) for _ in range(rng.randint(1, 3))))
        before = [shadow.hits for shadow in shadows]
        serve_one(manager, ids)
        lru, arc, slru = (shadow.hits - hits for shadow, hits in zip(shadows, before, strict=True))
        behind = min(arc, slru) < lru
        assert policy.leader == "lru"
        assert (policy._tier.reserve == 0) == behind, request
        if behind:
            assert policy._tier._reserve is None  # its counts of reuses gone with it
            return
    pytest.fail("the guards never fell behind the leader")


def test_the_reserve_keeps_the_most_reused_of_its_blocks() -> None:
    """Room for one reserved block (3 % of 12, at least 1) and two candidates: prompt
    ``a``, used four times, and the younger prompt ``b``, used twice. Both leave LRU
    and stay in ARC; the reserve keeps ``a``, the more reused, not the younger ``b``."""
    policy = make_policy("leader", CAPACITY)
    assert isinstance(policy, LeaderPolicy) and policy._tier.reserve == 1
    manager = TierManager(medium=Medium.CPU, num_blocks=CAPACITY, block_size=16, policy=policy)
    for ids in ([0], [0], [0], [0], [1], [1]):
        serve_one(manager, ids)
    for i in range(30):
        serve_one(manager, [100 + 2 * i, 101 + 2 * i])
    shadows = {s.policy.name: s for s in policy._shadows}
    assert {block_key(0), block_key(1)} <= shadows["arc"].resident and not {
        block_key(0),
        block_key(1),
    } & shadows["lru"].resident
    assert (block_key(0) in policy._tier, block_key(1) in policy._tier) == (True, False)
    assert serve_one(manager, [0]) == 1


def test_a_switch_gives_the_reserve_up() -> None:
    """The prompt comes back twice after one-offs that push it out of LRU: ARC and SLRU
    hit it, LRU does not, and after the second time ARC's lead is significant. The
    tier switches to ARC, and keeps no reserve from then on."""
    policy = make_policy("leader", CAPACITY)
    assert isinstance(policy, LeaderPolicy)
    manager = TierManager(medium=Medium.CPU, num_blocks=CAPACITY, block_size=16, policy=policy)
    for _ in range(3):
        serve_one(manager, [0])
    for gap in range(2):
        for i in range(30):
            serve_one(manager, [100 + 60 * gap + 2 * i, 101 + 60 * gap + 2 * i])
        assert policy.leader == "lru" and policy._tier.reserve > 0
        assert serve_one(manager, [0]) == 1  # from the reserve
    assert policy.leader == "arc"
    assert policy._tier.reserve == 0
