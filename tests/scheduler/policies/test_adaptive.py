"""The adaptive policy: LRU at share 0, slru's structure above, shares picked by shadows."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockHash, Medium
from kvtier.scheduler import CPUOffloadingManager, OffloadingManager
from kvtier.scheduler.manager import TierManager
from kvtier.scheduler.policies import AdaptivePolicy
from kvtier.scheduler.policies.adaptive import SHARES
from kvtier.sim.replay import replay
from kvtier.sim.workload import generate, shaped

from .twins import block_key as _k
from .twins import serve_one


def _workload() -> list[list[int]]:
    """Chats that extend their history, with one-time scans between them."""
    requests: list[list[int]] = []
    chats = [[1000 * c] for c in range(6)]
    fresh = 10**6
    for step in range(400):
        chat = chats[step % 6]
        chat.append(chat[-1] + 1)
        requests.append(list(chat[-12:]))  # the last 12 blocks of its history
        if step % 3 == 0:
            requests.append(list(range(fresh, fresh + 9)))  # a one-time scan
            fresh += 9
    return requests


class _Frozen(AdaptivePolicy):
    """Never decides: keeps the share it starts with."""

    def __init__(self, capacity: int, leader: int) -> None:
        super().__init__(capacity)
        self._left = 10**12
        self._leader = leader
        self._share_cap = int(capacity * SHARES[leader])


def _hits(policy_name: str | None, capacity: int, leader: int = 0) -> int:
    if policy_name is None:
        m = TierManager(
            medium=Medium.CPU, num_blocks=capacity, block_size=16, policy=_Frozen(capacity, leader)
        )
    else:
        m = CPUOffloadingManager(num_blocks=capacity, block_size=16, eviction_policy=policy_name)
    return sum(serve_one(m, ids) for ids in _workload())


def test_share_zero_is_exactly_lru() -> None:
    for capacity in (10, 40, 90):
        assert _hits(None, capacity, leader=0) == _hits("lru", capacity)


def test_share_point_nine_is_exactly_slru() -> None:
    assert SHARES[-1] == 0.9
    for capacity in (10, 40, 90):
        assert _hits(None, capacity, leader=len(SHARES) - 1) == _hits("slru", capacity)


def test_it_starts_as_slru_and_moves_to_the_winning_share() -> None:
    # Documents asked about again soon: protecting reused blocks starves probation,
    # so the shadows soon find share 0 (LRU) better and the tier follows them.
    trace = generate(replace(shaped("documents", 7, block_size=16), requests=600))
    shares: list[float] = []

    def share(m: OffloadingManager) -> None:
        assert isinstance(m, TierManager) and isinstance(m.policy, AdaptivePolicy)
        shares.append(m.policy.share)

    hits = replay(trace, 229, "adaptive", after_request=share).ratios.hit_blocks
    assert shares[0] == 0.9 and shares.index(0.0) == 11 and set(shares[11:]) == {0.0}
    assert hits == 8899  # slru: 5299; lru: 8973
    assert [replay(trace, 229, p).ratios.hit_blocks for p in ("lru", "slru")] == [8973, 5299]


def _never_held(key: BlockHash) -> bool:
    return False


def test_over_its_share_protected_competes_with_probation_by_last_use() -> None:
    policy = AdaptivePolicy(20)  # starts at share 0.9: exactly slru
    for i in range(20):
        policy.add(_k(i))
        policy.release(_k(i))
        policy.touch(_k(i), True)  # every block reused; 0 and 1 demoted again
    policy.touch(_k(5), True)  # 5 is now the most recent of all
    assert policy.sizes[:2] == (2, 18)
    assert policy.choose_victims(3, _never_held, (), []) == [_k(0), _k(1), _k(2)]
    policy._share_cap = 0  # as a decision for share 0 sets it
    # last uses: 0 and 1 (probation) before 2, 3, ... (protected): the older goes first
    assert policy.choose_victims(3, _never_held, (), []) == [_k(0), _k(1), _k(2)]
    policy.add(_k(50))  # new in probation, newer than every protected block but 5
    policy.release(_k(50))
    victims = policy.choose_victims(19, _never_held, (), [])
    assert victims is not None
    assert victims[:2] == [_k(0), _k(1)] and victims[-2:] == [_k(18), _k(19)]
    assert _k(5) not in victims and _k(50) not in victims  # the two most recent stay
    policy._share_cap = 17  # one over the share: one protected block competes
    assert policy.choose_victims(4, _never_held, (), []) == [_k(0), _k(1), _k(2), _k(50)]


class _Model:
    """The tier's rules at a fixed share, written plainly (lists, a clock)."""

    def __init__(self, capacity: int, share: float) -> None:
        self.prob: list[BlockHash] = []  # coldest first
        self.prot: list[BlockHash] = []
        self.ghost: list[BlockHash] = []  # oldest first
        self.used: dict[BlockHash, int] = {}
        self.clock = 0
        self.prot_max = max(1, int(capacity * 0.9))
        self.share_cap = int(capacity * share)
        self.ghost_cap = 4 * capacity

    def _use(self, key: BlockHash) -> None:
        self.clock += 1
        self.used[key] = self.clock

    def _protect(self, key: BlockHash) -> None:
        self.prot.append(key)
        if len(self.prot) > self.prot_max:
            self.prob.append(self.prot.pop(0))

    def add(self, key: BlockHash) -> None:
        self._use(key)
        if key in self.ghost:
            self.ghost.remove(key)
            self._protect(key)
        else:
            self.prob.append(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        self._use(key)
        if key in self.prob:
            self.prob.remove(key)
            if reused:
                self._protect(key)
            else:
                self.prob.append(key)
        else:
            self.prot.remove(key)
            self.prot.append(key)

    def victims(self, n: int) -> list[BlockHash] | None:
        prob, prot, out = list(self.prob), list(self.prot), []
        excess = len(prot) - self.share_cap
        while len(out) < n:
            if prot and (not prob or (excess > 0 and self.used[prot[0]] < self.used[prob[0]])):
                out.append(prot.pop(0))
                excess -= 1
            elif prob:
                out.append(prob.pop(0))
            else:
                return None
        return out

    def evict(self, victims: list[BlockHash]) -> None:
        for key in victims:
            (self.prob if key in self.prob else self.prot).remove(key)
            del self.used[key]
            self.ghost.append(key)
        del self.ghost[: max(0, len(self.ghost) - self.ghost_cap)]


@settings(max_examples=300, deadline=None)
@given(
    leader=st.integers(0, len(SHARES) - 1),
    ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8), st.booleans()), max_size=120),
)
@example(  # share 0: a block used after two reused ones goes before them
    leader=0,
    ops=[(0, i, False) for i in range(6)]
    + [(1, 3, True), (1, 4, True), (1, 0, False), (2, 2, False)],
)
def test_the_tier_follows_the_plain_model(leader: int, ops: list[tuple[int, int, bool]]) -> None:
    capacity = 6
    policy, model = _Frozen(capacity, leader), _Model(capacity, SHARES[leader])
    for op, i, flag in ops:
        key = _k(i)
        resident = key in model.used
        if op == 0 and not resident:
            if len(model.used) == capacity:
                victims = model.victims(1)
                assert victims is not None
                assert policy.choose_victims(1, _never_held, (), []) == victims
                policy.evict(victims)
                model.evict(victims)
            policy.add(key)
            policy.release(key)
            model.add(key)
        elif op == 1 and resident:
            policy.touch(key, flag)
            model.touch(key, flag)
        elif op == 2:
            n = 1 + i % 3
            assert policy.choose_victims(n, _never_held, (), []) == model.victims(n)
        assert len(policy) == len(model.used)
