"""The leader policy's tier calls that no test reached: ``follows``, and a sampled
tier's ``add``, ``touch`` and ``release``.

Written for the mutants of ``leader.py`` that survived ``scripts/mutate.sh policies``
(``docs/survivors-sv3.md``): an in-step tier that forgot its leader (``follows``
fails), a sampled tier that adds or releases ``None`` instead of the key, and one
whose touches lose ``reused`` (SLRU then never promotes).
"""

from __future__ import annotations

import pytest

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import LeaderPolicy, leader, sampling


def _k(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def _never_held(key: BlockHash) -> bool:
    return False


def _sampled(mp: pytest.MonkeyPatch, start: int) -> LeaderPolicy:
    """A tier of 8 blocks that samples (R = 4), following ``CANDIDATES[start]``."""
    mp.setattr(sampling, "FULL_SHADOWS_BELOW", 4)
    mp.setattr(sampling, "SAMPLED_SHADOW_BLOCKS", 2)
    mp.setattr(leader, "START", start)
    policy = LeaderPolicy(8)
    assert policy.sample_rate == 4
    return policy


def test_an_in_step_tier_follows_lru_first_then_the_leader_it_switches_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decision after every request (window 1): a block used twice survives a scan
    of four in ARC and SLRU but not in LRU, so its return hands the lead to ARC (the
    first of the two tied best; ``SIGNIFICANCE`` 0: one request's lead is exactly one
    standard deviation, not more)."""
    monkeypatch.setattr(leader, "WINDOW_MIN", 1)
    monkeypatch.setattr(leader, "SIGNIFICANCE", 0.0)
    policy = LeaderPolicy(4)
    assert policy.sample_rate == 1
    assert (policy.leader, policy.follows) == ("lru", "lru")
    a = _k(0)
    for keys in ([a], [a], [_k(1)], [_k(2)], [_k(3)], [_k(4)]):
        policy.observe(keys)
    assert (policy.leader, policy.follows) == ("lru", "lru")
    policy.observe([a])
    assert (policy.leader, policy.follows) == ("arc", "arc")


def test_a_sampled_tier_adds_each_key_to_its_leaders_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = _sampled(monkeypatch, 0)
    keys = [_k(i) for i in range(3)]
    for key in keys:
        policy.add(key)
    assert len(policy) == 3
    assert policy.choose_victims(3, _never_held, (), ()) == keys


def test_a_sampled_tier_passes_a_reuse_on_to_its_leaders_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Following SLRU, a reused block is promoted to protected; a recency-only touch
    leaves it on probation."""
    policy = _sampled(monkeypatch, 2)
    a, b, c = _k(0), _k(1), _k(2)
    policy.add_all([a, b, c])
    policy.touch(a, True)
    policy.touch(b, False)
    assert policy.sizes == (2, 1, 0)  # (probation, protected, ghosts)
    assert policy.choose_victims(3, _never_held, (), ()) == [c, b, a]


def test_a_sampled_tier_releases_a_held_block_for_eviction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block held at a search is parked; released, it is the next victim."""
    policy = _sampled(monkeypatch, 0)
    a, b = _k(0), _k(1)
    policy.add_all([a, b])
    assert policy.choose_victims(1, lambda key: key == a, (), ()) == [b]
    policy.evict([b])
    assert policy.choose_victims(1, _never_held, (), ()) is None  # a stays parked
    policy.release(a)
    assert policy.choose_victims(1, _never_held, (), ()) == [a]
