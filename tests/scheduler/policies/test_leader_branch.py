"""The leader's fourth shadow, ``branch`` (shared-prefix LRU), against its plain model.

``SharedPrefixPolicy`` is not registered on its own, so the suites parametrized over
``POLICIES`` reach it only through ``leader``. Here it is driven alone, the way the
manager drives a policy (lookups shown to ``observe``, batched stores with their own
keys protected, stores completing or failing, load pins, touches), in a Hypothesis
state machine beside ``BranchModel``: after every step the same victims in the same
order, list sizes, target ``p``, learned keys and shared marks. Generations are made
short, so aging happens often. Then the properties the model does not spell out: the
memory bound, the forks surviving aging, sampling keeping a root's requests together,
a sampled tier that follows ``branch`` learning every request, and eviction and
touch costs that do not grow with pinned blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import LeaderPolicy, branch, leader, sampling
from kvtier.scheduler.policies.branch import SharedPrefixPolicy
from kvtier.scheduler.policies.timed import TimedRecencyList
from kvtier.sim.workload import generate, shaped
from tests.budget import examples

from .models import BranchModel
from .twins import block_key

KEYS = 12  # a small key space: branching points, ghosts and returns are frequent


def _model(capacity: int) -> BranchModel:
    return BranchModel(
        capacity,
        share=branch.SHARE,
        kids=branch.KIDS,
        generation=max(branch.MIN_GENERATION, branch.PRUNE_FACTOR * capacity // 2),
    )


class BranchTwins(RuleBasedStateMachine):
    """The policy and its model fed the same calls; every answer compared."""

    capacity = 4

    def __init__(self) -> None:
        super().__init__()
        self.real = SharedPrefixPolicy(self.capacity)
        self.model = _model(self.capacity)
        self.resident: set[BlockHash] = set()
        self.storing: set[BlockHash] = set()
        self.pins: dict[BlockHash, int] = {}

    def _held(self, key: BlockHash) -> bool:
        return key in self.storing or self.pins.get(key, 0) > 0

    def _victims(
        self, n: int, protected: set[BlockHash], incoming: list[BlockHash]
    ) -> list[BlockHash] | None:
        want = self.model.choose_victims(n, self._held, protected, incoming)
        got = self.real.choose_victims(n, self._held, protected, incoming)
        assert got == want, f"victims of {n}: {got} != model {want}"
        return got

    @rule(ids=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=5), settle=st.booleans())
    def lookup(self, ids: list[int], settle: bool) -> None:
        """A request: observed, its resident keys touched, its misses stored (and, when
        ``settle``, the store completed at once: blocks churn)."""
        keys = [block_key(i) for i in dict.fromkeys(ids)]
        self.real.observe(keys)
        self.model.observe(keys)
        self.touch(ids)
        to_store = [key for key in keys if key not in self.resident]
        if not to_store or len(to_store) > self.capacity:
            return
        need = len(self.resident) + len(to_store) - self.capacity
        if need > 0:
            victims = self._victims(need, set(keys), to_store)
            if victims is None:
                return
            self.real.evict(victims)
            self.model.evict(victims)
            self.resident.difference_update(victims)
        self.real.add_all(to_store)
        for key in to_store:
            self.model.add(key)
        self.resident.update(to_store)
        if settle:
            self.real.release_all(to_store)
            for key in to_store:
                self.model.release(key)
        else:
            self.storing.update(to_store)

    @rule(i=st.integers(0, KEYS - 1), ok=st.booleans())
    def done(self, i: int, ok: bool) -> None:
        key = block_key(i)
        if key not in self.storing:
            return
        self.storing.discard(key)
        if ok:
            self.real.release(key)
            self.model.release(key)
        else:
            self.real.remove(key)
            self.model.remove(key)
            self.resident.discard(key)

    @rule(i=st.integers(0, KEYS - 1))
    def pin(self, i: int) -> None:
        key = block_key(i)
        if key in self.resident and key not in self.storing:
            self.pins[key] = self.pins.get(key, 0) + 1

    @rule(i=st.integers(0, KEYS - 1))
    def unpin(self, i: int) -> None:
        key = block_key(i)
        if self.pins.get(key, 0) > 0:
            self.pins[key] -= 1
            if self.pins[key] == 0:
                self.real.release_all([key])
                self.model.release(key)

    @rule(ids=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=5))
    def touch(self, ids: list[int]) -> None:
        keys = [block_key(i) for i in reversed(ids) if block_key(i) in self.resident]
        self.real.touch_all(keys, self.storing)
        for key in keys:
            self.model.touch(key, key not in self.storing)

    @rule(n=st.integers(1, 4))
    def probe(self, n: int) -> None:
        before = self.real.sizes, self.real.target
        self._victims(n, set(), [])
        assert (self.real.sizes, self.real.target) == before, "choose_victims changed it"

    @invariant()
    def same_state(self) -> None:
        real, model = self.real, self.model
        assert len(real) == len(model) == len(self.resident)
        assert real.sizes == model.sizes
        assert real.target == model.p
        assert real.learned == len(model.nexts)
        keys = [block_key(i) for i in range(KEYS)]
        assert [real.is_shared(key) for key in keys] == [key in model.marked for key in keys]
        self._victims(len(self.resident) or 1, set(), [])


@pytest.mark.parametrize("capacity", [1, 2, 4, 6])
def test_branch_matches_its_model_step_by_step(
    monkeypatch: pytest.MonkeyPatch, capacity: int
) -> None:
    monkeypatch.setattr(branch, "MIN_GENERATION", 3)  # generations of a few keys: aging
    BranchTwins.capacity = capacity
    run_state_machine_as_test(
        BranchTwins,
        settings=settings(
            max_examples=examples(150), stateful_step_count=60, deadline=None, derandomize=True
        ),
    )


def test_what_is_learned_stays_within_its_bound() -> None:
    """At most a generation (``PRUNE_FACTOR / 2`` x capacity keys, plus one request's)
    learned now and one before: on a
    chat trace whose distinct keys are 100 times the tier."""
    trace = generate(replace(shaped("chat", 3), requests=800))
    capacity = 16
    policy = SharedPrefixPolicy(capacity)
    generation = max(branch.MIN_GENERATION, branch.PRUNE_FACTOR * capacity // 2)
    most = 0
    for request in trace.requests:
        policy.observe(request.keys)
        assert policy.learned <= generation + len(request.keys)
        most = max(most, policy.learned + len(policy._old))
    assert most <= 2 * (generation + max(len(r.keys) for r in trace.requests))
    assert trace.num_distinct_blocks > 100 * capacity


def _k(i: int) -> BlockHash:
    return block_key(i)


def test_a_branching_point_is_shared_with_every_key_before_it() -> None:
    policy = SharedPrefixPolicy(8)
    prompt = [_k(1), _k(2)]
    for turn in (10, 20):
        policy.observe([*prompt, _k(turn), _k(turn + 1)])
    assert not any(map(policy.is_shared, prompt))  # two next keys: a document asked twice
    policy.observe([*prompt, _k(30)])
    assert list(map(policy.is_shared, prompt)) == [True, True]
    assert not policy.is_shared(_k(30))  # after the branching point: one conversation's
    assert not policy.is_shared(_k(10))


def test_a_fork_survives_the_aging_of_the_histories_around_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt's branching point is kept across generations while the histories that
    followed it are forgotten; its prefix is shared again at the next request on it."""
    monkeypatch.setattr(branch, "MIN_GENERATION", 8)
    policy = SharedPrefixPolicy(1)  # generations of 8 keys
    prompt = [_k(1), _k(2)]
    for turn in (10, 20, 30):
        policy.observe([*prompt, _k(turn)])
    for fresh in range(100, 140, 2):  # 20 unrelated requests: several generations
        policy.observe([_k(fresh), _k(fresh + 1)])
    assert not policy.is_shared(_k(1))  # not looked up for two generations: forgotten
    assert policy.learned <= 8 + 2
    policy.observe([*prompt, _k(40)])  # the fork was kept: no three requests needed again
    assert list(map(policy.is_shared, prompt)) == [True, True]


def test_a_sampled_shadow_learns_a_root_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shadows sample requests by their first key, so the branch shadow sees every
    request on a sampled prompt (and none on another): parent and children together."""
    policy = LeaderPolicy(2**17)  # R = 16
    rate = policy.sample_rate
    assert rate == sampling.sample_rate(2**17) == 16
    shadow = policy._shadows[leader.CANDIDATES.index(SharedPrefixPolicy)].policy
    assert isinstance(shadow, SharedPrefixPolicy)
    roots = [_k(i) for i in range(64)]
    sampled = next(r for r in roots if sampling.is_sampled([r], rate - 1))
    skipped = next(r for r in roots if not sampling.is_sampled([r], rate - 1))
    for root in (sampled, skipped):
        for turn in range(3):
            policy.observe([root, _k(1000 + turn)])
    assert shadow.is_shared(sampled)
    assert not shadow.is_shared(skipped)


def test_a_sampled_tier_that_follows_branch_learns_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rebuilt tier's own instance is shown every lookup, sampled or not."""
    monkeypatch.setattr(leader, "START", leader.CANDIDATES.index(SharedPrefixPolicy))
    policy = LeaderPolicy(2**17)
    tier = policy._tier.policy  # type: ignore[union-attr]
    assert isinstance(tier, SharedPrefixPolicy) and policy.follows == "branch"
    rate = policy.sample_rate
    skipped = next(_k(i) for i in range(64) if not sampling.is_sampled([_k(i)], rate - 1))
    for turn in range(3):
        policy.observe([skipped, _k(1000 + turn)])
    assert tier.is_shared(skipped)


@pytest.mark.parametrize("over", [False, True])
def test_eviction_does_not_walk_pinned_blocks_twice(over: bool) -> None:
    """Pinned blocks at the cold end are parked by the first search: the second asks
    about the victim only, however many are pinned -- also while the
    shared list is over its target and the two lists compete by last use."""
    policy = SharedPrefixPolicy(2000)
    keys = [_k(i) for i in range(1000)]
    if over:  # every key shared: 1,000 shared blocks against a target of 1,000 - 1
        for turn in range(3):
            policy.observe([*keys, _k(5000 + turn)])
        policy._target = 999.0
    policy.add_all(keys)
    assert policy.sizes == ((0, 1000) if over else (1000, 0))
    pinned = set(keys[:900])
    asked: list[BlockHash] = []

    def is_held(key: BlockHash) -> bool:
        asked.append(key)
        return key in pinned

    assert policy.choose_victims(1, is_held, (), ()) == [keys[900]]
    assert len(asked) >= 900
    asked.clear()
    assert policy.choose_victims(1, is_held, (), ()) == [keys[900]]
    assert set(asked) == {keys[900]}  # the list's walk asks about it twice


@pytest.mark.parametrize("case", ["parked", "alternating"])
def test_touching_is_linear_in_the_keys_whatever_is_parked_or_shared(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``touch_all`` of n keys hands the lists' ``touch_listed`` at most 2n keys
    (each failed call counts what is left) -- not ~n^2/2, which a slice per run cost
    when every key was parked (a long prefix loading) or the keys alternated between
    the shared and the unshared list; and it still stamps each key once, in order."""
    n = 2000
    policy = SharedPrefixPolicy(2 * n)
    keys = [_k(i) for i in range(n)]
    if case == "alternating":  # the even keys: a shared prompt's blocks
        for turn in range(3):
            policy.observe([*keys[::2], _k(10**6 + turn)])
    policy.add_all(keys)
    if case == "parked":  # every block pinned: the search parks them all
        assert policy.choose_victims(1, lambda key: True, (), ()) is None
    assert policy.sizes == ((n // 2, n // 2) if case == "alternating" else (n, 0))
    passed: list[int] = []
    touch_listed = TimedRecencyList.touch_listed

    def counted(self: TimedRecencyList[BlockHash], keys: Sequence[BlockHash]) -> int:
        passed.append(len(keys))
        return touch_listed(self, keys)

    monkeypatch.setattr(TimedRecencyList, "touch_listed", counted)
    policy.touch_all(keys, ())
    assert sum(passed) <= 2 * n
    lists = (policy._shared, policy._unshared)
    times = [next(lst for lst in lists if key in lst).time(key) for key in keys]
    assert times == list(range(times[0], times[0] + n))  # each stamped once, in order


def test_asking_for_no_victims_gets_none_even_while_the_shared_list_is_over() -> None:
    """``docs/testing.md`` counts ``leader``'s ``need >= 0`` mutants equivalent because
    ``choose_victims(0, ...)`` is ``[]``; with the shared list over its target the
    merge loop took one victim before counting."""
    policy = SharedPrefixPolicy(8)
    keys = [_k(i) for i in range(4)]
    for turn in range(3):
        policy.observe([*keys, _k(100 + turn)])
    policy.add_all(keys)
    policy._target = 0.0
    assert policy.sizes == (0, 4)
    assert policy.choose_victims(0, lambda key: False, (), ()) == []
    assert policy.choose_victims(1, lambda key: False, (), ()) == [keys[0]]


def test_a_known_request_still_marks_the_keys_before_a_key_shared_since() -> None:
    """``observe``'s fast path skips a request whose key pairs were all learned this
    generation only when none of its keys is shared: ``a`` -> ``y`` was learned
    before ``y`` became a branching point (under other parents: keys that are not
    prefix-chained), and seeing ``a, y, z`` again marks ``a``."""
    policy = SharedPrefixPolicy(8)
    a, x, y, z = _k(1), _k(2), _k(3), _k(4)
    policy.observe([a, y, z])
    for child in (_k(10), _k(11)):
        policy.observe([x, y, child])
    assert policy.is_shared(y) and policy.is_shared(x) and not policy.is_shared(a)
    policy.observe([a, y, z])
    assert policy.is_shared(a)
