"""``SampledTier``: a ``leader`` tier whose shadows see a sample of the requests.

Runs in the scheduler; pure Python. From ``sampling.sample_rate(capacity)`` = R > 1
(tiers of 65,536 blocks and more) the shadows hold ``capacity // R`` keys and see 1
request in R (SHARDS), so they cost about 4/R of a full shadow per looked-up key, but
cannot say which of the tier's blocks the leader would hold. The tier keeps its blocks
in a real instance of the leader's policy instead; at a switch, at the next search for
victims, a new instance of the new leader's policy gets the tier's blocks. Touch and
eviction cost the policy's own (the instance's blocks are the tier's: no set of them is
kept beside it), and the instance is shown every lookup (``observe``), so a
``branch`` tier learns the whole traffic, not the sample.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.shadow import ShadowTier


class SampledTier(EvictionPolicy):
    """The tier's blocks in a real instance of the leader's policy, rebuilt on a switch.

    A switch takes effect at the next search for victims (the first call that can say
    which blocks are held): the new leader's instance gets the tier's held blocks
    (in the order they were added), then the others in the old instance's eviction
    order. So it starts as a tier of that policy that has seen each block once: LRU in
    the old eviction order, ARC with all in T1, SLRU with all on probation, no ghosts;
    the held blocks are parked again at its first search. O(capacity), at most once
    per decision window.
    """

    def __init__(self, capacity: int, leader: ShadowTier) -> None:
        super().__init__(capacity)
        # The tier's blocks are the instance's (no set of them beside it: that cost a
        # set insert and delete per stored and evicted block).
        self.policy = type(leader.policy)(capacity)
        self.learns = leader.learns  # whether ``policy`` learns in ``observe``
        self._next: type[EvictionPolicy] | None = None  # a leader not yet taken on

    reserve = 0  # a sampled tier keeps no reserve (``policies/leader_reserve.py``)

    def __len__(self) -> int:
        return len(self.policy)

    @property
    def sizes(self) -> tuple[int, ...]:
        sizes: tuple[int, ...] = getattr(self.policy, "sizes", (len(self.policy),))
        return sizes

    @property
    def follows(self) -> str:
        return self.policy.name

    def follow(self, evicted: Sequence[BlockHash], stored: Sequence[BlockHash]) -> None:
        """A sampled shadow's moves say nothing about most of the tier's blocks."""

    def lead(self, leader: ShadowTier) -> None:
        """Take on a new leader's policy at the next search for victims."""
        cls = type(leader.policy)
        self._next = None if cls is type(self.policy) else cls

    def _rebuild(self, cls: type[EvictionPolicy], is_held: IsHeld) -> None:
        held = sorted(filter(is_held, self.policy.keys()))  # sorted: a fixed order
        free = len(self.policy) - len(held)
        order = self.policy.choose_victims(free, is_held, (), ()) if free else []
        assert order is not None, "every block that is not held can be evicted"
        policy = cls(self.capacity)
        policy.add_all(held + order)
        self.policy = policy
        self.learns = cls.observe is not EvictionPolicy.observe
        self._next = None

    def observe(self, keys: Sequence[BlockHash]) -> None:
        """Every request, sampled or not: a policy that learns (``branch``; ``density``
        never leads a sampled tier) learns the tier's whole traffic."""
        self.policy.observe(keys)

    def add(self, key: BlockHash) -> None:
        self.policy.add(key)

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        self.policy.add_all(keys)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.policy:  # an absent key is ignored, whatever the leader
            self.policy.touch(key, reused)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        self.policy.touch_all(keys, storing)

    def remove(self, key: BlockHash) -> None:
        self.policy.remove(key)

    def release(self, key: BlockHash) -> None:
        self.policy.release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        self.policy.release_all(keys)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        if self._next is not None:
            self._rebuild(self._next, is_held)
        return self.policy.choose_victims(n, is_held, protected, incoming)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        self.policy.evict(victims)
