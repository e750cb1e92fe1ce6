"""Follow the leader: the tier keeps what the best of LRU, ARC, SLRU, branch and density would keep.

Runs in the scheduler; pure Python. No fixed policy wins everywhere (``docs/simulate.md``):
LRU is best when every block's next use is near (chat turns, re-asked documents), ARC
or a segmented LRU when most blocks are used once and the reused ones come back from
far, ``density`` (``policies/density.py``: learned hit density per class of block)
where chains end and prompts are shared (chat and agents at 1-25 %), and ``branch``
(``policies/branch.py``: LRU that spares the prompts many requests continue) at small
tiers under many conversations or agents on shared prompts. This policy runs each of
them, unchanged, as a keys-only *shadow* of the tier (``policies/shadow.py``) and
makes the tier follow the best shadow of the moment::

    observe(keys) ──► each shadow (a real lru / arc / slru / branch / density policy
                      over keys only) serves the request as the manager would
                      (``serve.serve_request``): prefix hit counted, resident keys
                      used, missing keys stored (its own evictions)
                  ──► LeadSwitch: scores decayed per window; a challenger takes over
                      on a significant lead (``policies/leader_switch.py``)

It follows LRU first. How the tier follows depends on its size
(``sampling.sample_rate``: R = 1 under 65,536 blocks):

* **In step** (R = 1, ``InStepTier``, ``policies/leader_in_step.py``): the shadows are
  the tier's size and see every request; the tier's victims are exactly the leader's.
  While it follows LRU it keeps a ``Reserve`` (``policies/leader_reserve.py``) of the
  blocks LRU evicted that ARC or SLRU still hold, given up for good at the first
  request on which they hit less than LRU, or the tier does.
* **Sampled** (R > 1, ``SampledTier``, ``policies/leader_sampled.py``): the shadows
  hold ``capacity // R`` keys and see 1 request in R (SHARDS); the tier keeps its
  blocks in a real instance of the leader's policy, rebuilt at a switch.

The parameters below were tuned on the 13 workloads of ``benchmarks/policy_cells.py``
and checked on held-out seeds (``docs/simulate.md``).

Lookup cost: a request whose keys every shadow holds is tested once for all of them
(``_everywhere``: the keys of requests that every shadow hit whole, less each key any
shadow evicts), and the switching rule's early test is skipped (no lead moved). Kept
that way, not as the exact intersection of the shadows' keys, since a store then pays
nothing: real requests (a chat turn, an agent step) end in new blocks and are seldom
hits whole.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from zlib import crc32

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.arc import ARCPolicy
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.branch import SharedPrefixPolicy
from kvtier.scheduler.policies.density import DensityPolicy
from kvtier.scheduler.policies.leader_in_step import InStepTier
from kvtier.scheduler.policies.leader_reserve import Reserve
from kvtier.scheduler.policies.leader_sampled import SampledTier
from kvtier.scheduler.policies.leader_switch import LeadSwitch, SwitchRule
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.policies.sampling import sample_rate
from kvtier.scheduler.policies.shadow import ShadowTier
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy
from kvtier.scheduler.serve import serve_request

CANDIDATES: tuple[type[EvictionPolicy], ...] = (
    LRUPolicy,
    ARCPolicy,
    SegmentedLRUPolicy,
    SharedPrefixPolicy,
    DensityPolicy,
)
"""The policies the shadows run (``START`` leads first, until another scores better)."""

IN_STEP_ONLY: tuple[type[EvictionPolicy], ...] = (DensityPolicy,)
"""Candidates a sampled leader (R > 1) runs no shadow of, last in ``CANDIDATES``:
``density`` learns per class from what it sees, and a shadow shown 1 request in R
with capacity / R would learn little for its cost (its lookups cost ~10x LRU's)."""

DECAY = 0.75
"""Weight of the past at each decision (the scores remember about four windows)."""

MARGIN = 0.0
"""Share of the leader's score a challenger must lead by to take over (ties keep it)."""

SIGNIFICANCE = 1.0
"""Standard deviations of its decayed per-request hit differences by which a
challenger's decayed score must lead the leader's to take over (``math.inf``: only
``EARLY`` decisions switch; 0: the best score leads). Switches on leads within noise
(LRU and ``branch`` trading the lead by 0.01-0.2 %) mostly stop; at 1 the tier lost
fewer cells to max(LRU, ARC) than at 0, and less than at 0.5 or 2."""

START = 0
"""Index in ``CANDIDATES`` of the shadow the tier follows first."""

WINDOW_MIN = 8192
"""Looked-up keys between decisions at least (else ``capacity // WINDOW_DIV``)."""

WINDOW_DIV = 4
"""Large tiers decide every quarter capacity's worth of looked-up keys, so that a lead
that shows late is followed sooner (windows of a whole capacity lose hits at 25 and
50 % of the synthetic trace)."""

EARLY = 4.0
"""Standard deviations of lead within a window that end it early (``math.inf``: never).
A window of 8,192 keys is up to 80 capacities of a small tier, and a policy that misses
20 % more (LRU on chat at 1 %) costs the tier 130-330 blocks before the first decision;
at three or two the test also switches on noise."""

RESERVE = 0.03
"""Share of an in-step tier kept, while it follows ``START``, for blocks ``START``'s
shadow evicted that a ``GUARDS`` shadow holds (``Reserve``). 0: no reserve."""

GUARDS: tuple[type[EvictionPolicy], ...] = (ARCPolicy, SegmentedLRUPolicy)
"""The shadows whose blocks the reserve keeps: the frequency-keeping ones."""

RESERVE_SCAN = 64
"""Blocks of the leader's coldest looked at per victim needed (plus 64) for one that
no guard holds, before the reserve gives up a block."""


class LeaderPolicy(EvictionPolicy):
    """The tier follows whichever of LRU, ARC, SLRU, branch and (in step) density has hit
    most lately."""

    name = "leader"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        rate = sample_rate(capacity)
        self._mask = rate - 1
        candidates = CANDIDATES if rate == 1 else [c for c in CANDIDATES if c not in IN_STEP_ONLY]
        self._shadows = tuple(ShadowTier(cls, capacity // rate) for cls in candidates)
        window = max(1, max(WINDOW_MIN, capacity // WINDOW_DIV) // rate)
        rule = SwitchRule(window, DECAY, MARGIN, SIGNIFICANCE, EARLY)
        self._switch = LeadSwitch(self._shadows, rule, START)
        # keys every shadow holds (a subset of the intersection of their ``resident``
        # sets): those of requests every shadow hit whole, less every key a shadow evicts
        self._everywhere: set[BlockHash] = set()
        self._guards = [i for i, s in enumerate(self._shadows) if type(s.policy) in GUARDS]
        self._gains: list[int] | None = None  # each shadow's hits in the last request
        self._tier: InStepTier | SampledTier
        leader = self._shadows[START]
        if rate == 1:
            size = max(1, round(RESERVE * capacity)) if RESERVE > 0 else 0
            guards = [self._shadows[i].resident for i in self._guards]
            reserve = Reserve(size, guards, RESERVE_SCAN) if size and guards else None
            self._tier = InStepTier(capacity, leader, reserve)
        else:
            self._tier = SampledTier(capacity, leader)

    @property
    def leader(self) -> str:
        """The name of the policy the tier follows now."""
        return self._shadows[self._switch.leader].policy.name

    @property
    def sizes(self) -> tuple[int, ...]:
        """For tests and diagnostics: ``(|extra|, |kept|)`` of a tier in step; else the
        leader's instance's ``sizes`` (its length for LRU)."""
        return self._tier.sizes

    @property
    def follows(self) -> str:
        """The name of the policy whose order the tier's blocks are in (a sampled tier
        takes a new leader's on at its next search for victims)."""
        return self._tier.follows

    @property
    def sample_rate(self) -> int:
        """``R``: the shadows see 1 request in ``R`` and hold ``capacity // R`` keys."""
        return self._mask + 1

    def __len__(self) -> int:
        return len(self._tier)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if not keys:
            return
        tier = self._tier
        if not tier.reserve:
            self._observe(keys)
            return
        assert isinstance(tier, InStepTier), "only a tier in step keeps a reserve"
        # The reserve is given up at the first request on which a guard hits less
        # than the leader, or the tier itself does (a switch gives it up too). The
        # shadows' requests do not change which blocks the tier holds.
        lead = self._switch.leader
        self._observe(keys)
        gains = self._gains  # None: every shadow hit every key
        led = len(keys) if gains is None else gains[lead]
        if (gains is not None and min(gains[i] for i in self._guards) < led) or (
            led and not tier.holds_all(keys[:led] if led < len(keys) else keys)
        ):
            tier.drop_reserve()

    def _observe(self, keys: Sequence[BlockHash]) -> None:
        """Serve the request in every (sampled) shadow; follow, and decide."""
        tier, mask = self._tier, self._mask
        if tier.learns:
            tier.observe(keys)
        if mask and crc32(keys[0]) & mask:  # not sampled (``sampling.is_sampled``, inline)
            return
        shadows, lead = self._shadows, self._shadows[self._switch.leader]
        everywhere = self._everywhere
        n = len(keys)
        if everywhere.issuperset(keys):  # every shadow holds every key: all hit them all
            backwards = keys[::-1]
            for shadow in shadows:
                shadow.hit_all(keys, backwards)
            self._gains = None
        else:
            gains = []  # each shadow's hits in this request
            for shadow in shadows:
                gains.append(serve_request(shadow, keys))
                stored = shadow.last
                if stored is not None:
                    if everywhere and stored.block_hashes_evicted:
                        everywhere.difference_update(stored.block_hashes_evicted)
                    if shadow is lead:
                        tier.follow(stored.block_hashes_evicted, stored.block_hashes_to_store)
            if gains.count(n) == len(gains):  # each shadow hit every key: none was evicted
                everywhere.update(keys)
            self._gains = gains
        switched = self._switch.record(n, self._gains)
        if switched is not None:
            tier.lead(shadows[switched])

    def add(self, key: BlockHash) -> None:
        self._tier.add(key)

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        self._tier.add_all(keys)

    def touch(self, key: BlockHash, reused: bool) -> None:
        self._tier.touch(key, reused)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        self._tier.touch_all(keys, storing)

    def remove(self, key: BlockHash) -> None:
        self._tier.remove(key)

    def release(self, key: BlockHash) -> None:
        self._tier.release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        self._tier.release_all(keys)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        return self._tier.choose_victims(n, is_held, protected, incoming)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        self._tier.evict(victims)
