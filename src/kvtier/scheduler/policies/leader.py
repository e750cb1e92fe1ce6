"""Follow the leader: the tier keeps what the best of LRU, ARC, SLRU, branch and density would keep.

Runs in the scheduler; pure Python. No fixed policy wins everywhere (``docs/simulate.md``):
LRU is best when every block's next use is near (chat turns, re-asked documents), ARC
or a segmented LRU when most blocks are used once and the reused ones come back from
far, ``density`` (``policies/density.py``: learned hit density per class of block)
where chains end and prompts are shared (chat and agents at 1-25 %), and ``branch``
(``policies/branch.py``: LRU that spares the prompts many requests
continue) at small tiers under many conversations or agents on shared prompts. This
policy runs each of them, unchanged, as a keys-only *shadow* of the tier and makes the
tier follow the best shadow of the moment::

    observe(keys) ──► each shadow (a real lru / arc / slru / branch / density policy
                      over keys only; branch and density first learn from the request)
                      serves the request as the manager would: prefix hit counted,
                      resident keys used, missing keys stored (its own evictions)

It follows LRU first. After each window of ``max(WINDOW_MIN, capacity // WINDOW_DIV)``
looked-up keys every shadow's score is decayed by ``DECAY`` and its prefix hits are
added. The tier follows the shadow with the best score, but a challenger takes over
only on a *significant* lead: its score must beat the leader's by the share ``MARGIN``
and by more than ``SIGNIFICANCE`` standard deviations -- the square root of the sum,
over the requests, of the squared difference of the two shadows' hits in each, every
window's weighted by the square of its scores' weight (``DECAY`` squared per window,
kept for every pair of shadows, so it holds across changes of leader). The test runs
after every (sampled) request on the scores as they would be were the window to end
there, and a significant lead ends the window at once; switches on leads within
noise (LRU and ``branch`` trading the lead on 0.01-0.2 %) mostly stop, while a large
real lead is followed sooner than at a window's end. A window also ends early once a
challenger's hits in it lead the leader's by more than ``EARLY`` standard deviations
of this window's differences alone; that decision takes the best score without the
significance test. Decisions on ``EARLY`` are at least 17 (sampled) requests apart:
over n requests the lead is at most sqrt(n) standard deviations (Cauchy-Schwarz), so
``EARLY`` = 4 needs n > 16 (and ``SIGNIFICANCE`` = 1 at least two requests). Tuned on
the 13 workloads of ``benchmarks/policy_cells.py`` and checked on held-out seeds
(``docs/simulate.md``). (The *hedge* of the sixth round -- a further shadow holding
the leader's blocks less 5 % of the tier kept for the runner-up's, followed while it
out-hit the leader by 2 standard deviations -- was removed in the tenth: with
``density`` among the shadows it changed no cell and cost a shadow's CPU.) How the
tier follows depends on its size (``sampling.sample_rate``: R = 1 under 65,536
blocks):

* **In step** (R = 1, ``_InStep``): the shadows are the tier's size and see every
  request. The tier's blocks sit in two recency lists, *kept* (the leading shadow holds
  the block) and *extra* (it evicted it); victims come from extra first. The manager
  calls ``observe`` at lookup, before it touches or stores the request's
  blocks, so the leader has already evicted what the tier will: the tier's victims
  are exactly the leader's. A switch re-sorts the blocks into kept and extra:
  O(capacity), at most once per decision. Until then, while it follows ``START``, the
  tier keeps a *reserve* (``RESERVE``): blocks of extra that a ``GUARDS`` shadow (ARC,
  SLRU) holds stay, up to ``RESERVE`` of the tier, and LRU's coldest blocks that no
  guard holds go instead. While every shadow hits alike nothing tells LRU's choice
  from ARC's, and the blocks only the frequency shadows kept were all four of the
  cells ``leader`` lost to ARC (issue 14). The reserve is given up for good at the
  first request on which a guard hits less than the leader, or the tier does
  (``observe``), and at the first switch; from then on the tier's victims are the
  leader's.
* **Sampled** (R > 1, ``_Rebuilt``): the shadows hold ``capacity // R`` keys and see
  1 request in R (SHARDS), so they cost about 4/R of a full shadow per looked-up key,
  but cannot say which of the tier's blocks the leader would hold. The tier keeps its
  blocks in a real instance of the leader's policy instead; at a switch, at the next
  search for victims, a new instance of the new leader's policy gets the tier's
  blocks, held ones first, then the others in the old instance's eviction order (as
  if each had been stored once, in that order: no ghosts, nothing protected yet; a
  new ``branch`` instance has learned no structure yet). O(capacity), at most once
  per decision; touch and eviction cost the policy's own (the instance's blocks are
  the tier's: no set of them is kept beside it). The instance is shown every lookup
  (``observe``), so a ``branch`` tier learns the whole traffic, not the sample.

Lookup cost: a request whose keys every shadow holds is tested once for all of them
(``_everywhere``: the keys of requests that every shadow hit whole, less each key any
shadow evicts), and the early test is skipped (no lead moved). Kept that way, not as
the exact intersection of the shadows' keys, since a store then pays nothing: real
requests (a chat turn, an agent step) end in new blocks and are seldom hits whole.

Eviction cost: every list is a ``RecencyList`` (held blocks are parked), so it is
proportional to the blocks evicted, not to the blocks pinned (a rebuilt instance
parks the held blocks again at its first search: O(held) once per switch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from itertools import filterfalse, islice, repeat
from zlib import crc32

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.arc import ARCPolicy
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.branch import SharedPrefixPolicy
from kvtier.scheduler.policies.density import DensityPolicy
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.sampling import sample_rate
from kvtier.scheduler.policies.segmented import SegmentedPolicy
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
``EARLY`` decisions switch; 0: the best score leads). At 1, issue 14's cells lost to
max(LRU, ARC) go from 10 to 8 of 65 and from 5 and 6 to 4 and 5 of 40 on the held-out
seeds, with smaller losses; at 0.5 and 2 the losses grow (``docs/simulate.md``)."""

START = 0
"""Index in ``CANDIDATES`` of the shadow the tier follows first."""

WINDOW_MIN = 8192
"""Looked-up keys between decisions at least (else ``capacity // WINDOW_DIV``)."""

WINDOW_DIV = 4
"""Large tiers decide every quarter capacity's worth of looked-up keys, so a lead that
shows late is followed sooner: windows of a whole capacity cost the synthetic trace
0.06 points at 25 % and 0.11 at 50 % (``docs/simulate.md``)."""

EARLY = 4.0
"""Standard deviations of lead that end a window early (``math.inf``: never). A window of
8,192 keys is up to 80 capacities of a small tier, and a policy that misses 20 % more
(LRU on chat at 1 %) cost the tier 130-330 blocks before the first decision. At four
the test fires once to three times in the few cells it changes (``chat`` seed 2 at
1 %: after 5,244 of the first window's 8,192 keys); at three or two it also switches
on noise (``docs/simulate.md``)."""

RESERVE = 0.03
"""Share of the tier an in-step tier keeps, while it follows ``START``, for blocks
``START``'s shadow evicted that a ``GUARDS`` shadow holds (the *reserve*). It is given
up for good at the first request on which a guard hits less than the leader, or the
tier itself does, and at the first switch (``_InStep``). 0: no reserve."""

GUARDS: tuple[type[EvictionPolicy], ...] = (ARCPolicy, SegmentedLRUPolicy)
"""The shadows whose blocks the reserve keeps: the frequency-keeping ones."""

RESERVE_SCAN = 64
"""Blocks of the leader's coldest looked at per victim needed (plus 64) for one that
no guard holds, before the reserve gives up a block."""

_ROUNDING = 1 + 1e-9
"""A lead within rounding of ``SIGNIFICANCE`` standard deviations is not significant:
one request's difference alone is exactly one standard deviation, at every decay
after it, and the decays' rounding would decide it either way."""


class _InStep(SegmentedPolicy):
    """The tier's blocks in two recency lists, driven by a full-size leading shadow.

    *kept*: the leading shadow holds the block; *extra*: it evicted it (or never
    stored it). Victims come from extra first, so in step with the leader the tier
    evicts exactly the leader's victims.
    """

    learns = False  # ``observe`` is the base's: nothing to learn

    def __init__(
        self,
        capacity: int,
        leader: ShadowTier,
        guards: Sequence[set[BlockHash]] = (),
        reserve: int = 0,
    ) -> None:
        self._kept: RecencyList[BlockHash] = RecencyList()
        self._extra: RecencyList[BlockHash] = RecencyList()
        super().__init__(capacity, (self._extra, self._kept))
        self._leader = leader
        self._holds = leader.resident
        self._guards = guards  # the guards' ``resident`` sets
        self.reserve = reserve if guards else 0  # 0: given up
        self._uses: Counter[BlockHash] = Counter()  # reuses of each block, while reserving

    def holds_all(self, keys: Sequence[BlockHash]) -> bool:
        """Whether the tier holds every key (C-level when kept holds them all)."""
        return self._kept.holds_all(keys) or all(map(self.__contains__, keys))

    def drop_reserve(self) -> None:
        """Give the reserve up for good: from the next search the tier's victims are
        its leader's again (the reserved blocks first: they are in *extra*)."""
        self.reserve = 0
        self._uses = Counter()

    @property
    def sizes(self) -> tuple[int, ...]:
        return len(self._extra), len(self._kept)

    @property
    def follows(self) -> str:
        return self._leader.policy.name

    def follow(self, evicted: Sequence[BlockHash], stored: Sequence[BlockHash]) -> None:
        """The leading shadow evicted and stored these keys."""
        kept, extra = self._kept, self._extra
        for key in evicted:
            if key in kept:
                kept.remove(key)
                extra.add(key)
        for key in stored:
            if key in extra:
                extra.remove(key)
                kept.add(key)

    def lead(self, leader: ShadowTier) -> None:
        """Split the tier's blocks anew into kept and extra for a new leader."""
        self.drop_reserve()
        self._leader = leader
        holds = self._holds = leader.resident
        kept, extra = self._kept, self._extra
        for key in [key for key in kept.ordered() if key not in holds]:
            kept.remove(key)
            extra.add(key)
        for key in [key for key in extra.ordered() if key in holds]:
            extra.remove(key)
            kept.add(key)

    def add(self, key: BlockHash) -> None:
        if key in self._holds:
            self._kept.add(key)
        else:
            self._extra.add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._kept:
            self._kept.touch(key)
        elif key in self._extra:
            self._extra.touch(key)
        if reused and self.reserve:
            self._uses[key] += 1

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        kept, extra = self._kept, self._extra
        done = kept.touch_listed(keys)  # the usual case: all in kept (C-level)
        for key in keys[done:]:
            if key in kept:
                kept.touch(key)
            elif key in extra:
                extra.touch(key)
        if self.reserve:  # reuses: the keys not being stored (C-level count)
            self._uses.update(filterfalse(storing.__contains__, keys) if storing else keys)

    def remove(self, key: BlockHash) -> None:
        super().remove(key)
        self._uses.pop(key, None)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        if not self.reserve:
            return self._coldest_in_order(n, is_held, protected, (self._extra, self._kept))
        return self._victims_reserving(n, is_held, protected)

    def _victims_reserving(
        self, n: int, is_held: IsHeld, protected: Collection[BlockHash]
    ) -> list[BlockHash] | None:
        """Victims while the tier keeps a reserve, in this order: blocks the leader
        evicted that no guard holds (coldest first); the reserved blocks -- evicted by
        the leader, held by a guard -- past ``reserve``, least reused first (then
        coldest); the leader's coldest blocks that no guard holds, among its
        ``RESERVE_SCAN`` coldest per victim needed; the other reserved blocks; the
        leader's coldest."""
        guards = self._guards
        coldest = self._extra.coldest(n, is_held, protected)
        if coldest is not None and all(map(set.isdisjoint, guards, repeat(coldest))):
            return coldest  # the usual case: extra's coldest are unguarded (C-level)

        def guarded(key: BlockHash) -> bool:
            return any(key in guard for guard in guards)

        victims: list[BlockHash] = []
        reserved: list[BlockHash] = []  # coldest first
        search = self._extra.evictable(is_held, protected)
        for key in search:
            if guarded(key):
                reserved.append(key)
                continue
            victims.append(key)
            if len(victims) == n:
                search.close()
                return victims
        search.close()
        over = len(reserved) - self.reserve
        if over > 0:
            reserved = self._least_reused(reserved)
            victims += reserved[: min(over, n - len(victims))]
            reserved = reserved[over:]
        if len(victims) < n:
            need = n - len(victims)
            search = self._kept.evictable(is_held, protected)
            coldest = list(islice(search, RESERVE_SCAN * need + 64))
            search.close()
            victims += list(islice(filterfalse(guarded, coldest), need))
        if len(victims) < n and reserved:
            if over <= 0:
                reserved = self._least_reused(reserved)
            victims += reserved[: n - len(victims)]
        if len(victims) < n:
            chosen = set(victims)
            search = self._kept.evictable(is_held, protected)
            victims += list(islice(filterfalse(chosen.__contains__, search), n - len(victims)))
            search.close()
        return victims if len(victims) == n else None

    def _least_reused(self, keys: list[BlockHash]) -> list[BlockHash]:
        """``keys`` (coldest first) least reused first; the sort is stable, so the
        coldest first among equals (sorted only when some are taken)."""
        return sorted(keys, key=self._uses.__getitem__)  # a Counter: 0 if never reused

    def evict(self, victims: Sequence[BlockHash]) -> None:
        self.remove_all(victims)
        if self._uses:
            uses = self._uses
            for key in victims:
                uses.pop(key, None)


class _Rebuilt(EvictionPolicy):
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

    reserve = 0  # a sampled tier keeps no reserve (``RESERVE``)

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
        self._leader = START
        leader = self._shadows[START]
        # keys every shadow holds (a subset of the intersection of their ``resident``
        # sets): those of requests every shadow hit whole, less every key a shadow evicts
        self._everywhere: set[BlockHash] = set()
        n = len(self._shadows)
        self._scores = [0.0] * n
        self._pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        # per pair of shadows (``_pairs``, then ``_pair``): this window's sum of squared
        # per-request hit differences, and the decayed sum of the past windows'
        self._squares = [0] * len(self._pairs)
        self._spreads = [0.0] * len(self._pairs)
        self._pair = {}
        for p, (i, j) in enumerate(self._pairs):
            self._pair[i, j] = self._pair[j, i] = p
        self._window = max(1, max(WINDOW_MIN, capacity // WINDOW_DIV) // rate)
        self._left = self._window
        self._guards = [i for i, s in enumerate(self._shadows) if type(s.policy) in GUARDS]
        self._gains: list[int] | None = None  # each shadow's hits in the last request
        self._tier: _InStep | _Rebuilt
        if rate == 1:
            guards = [self._shadows[i].resident for i in self._guards]
            reserve = max(1, round(RESERVE * capacity)) if RESERVE > 0 else 0
            self._tier = _InStep(capacity, leader, guards, reserve)
        else:
            self._tier = _Rebuilt(capacity, leader)

    @property
    def leader(self) -> str:
        """The name of the policy the tier follows now."""
        return self._shadows[self._leader].policy.name

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
        assert isinstance(tier, _InStep), "only a tier in step keeps a reserve"
        # The reserve is given up at the first request on which a guard hits less
        # than the leader, or the tier itself does (a switch gives it up too). The
        # shadows' requests do not change which blocks the tier holds.
        lead = self._leader
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
        shadows, lead = self._shadows, self._shadows[self._leader]
        everywhere = self._everywhere
        n = len(keys)
        if everywhere.issuperset(keys):  # every shadow holds every key: all hit them all
            self._gains = None
            backwards = keys[::-1]
            for shadow in shadows:
                shadow.hit_all(keys, backwards)
            # no lead moved, so no early decision: ``_clear_lead`` and ``_challenger``
            # were false after the last request (or it decided: a decision that does not
            # switch decays a lead and its spread alike) and no difference changed
            self._left -= n
            if self._left <= 0:
                self._decide(clear=False)
            return
        gains = []  # each shadow's hits in this request
        for shadow in shadows:
            gains.append(serve_request(shadow, keys))
            stored = shadow.last
            if stored is not None:
                if everywhere and stored.block_hashes_evicted:
                    everywhere.difference_update(stored.block_hashes_evicted)
                if shadow is lead:
                    tier.follow(stored.block_hashes_evicted, stored.block_hashes_to_store)
        self._gains = gains
        if gains.count(n) == len(gains):  # each shadow hit every key: none was evicted
            everywhere.update(keys)
        self._left -= n
        if gains.count(gains[0]) < len(gains):  # some lead moved
            squares = self._squares
            for p, (i, j) in enumerate(self._pairs):
                squares[p] += (gains[i] - gains[j]) ** 2
            if self._left <= 0:
                self._decide(clear=False)
            elif self._clear_lead():
                self._decide(clear=True)
            elif self._challenger(self._decayed()) is not None:
                self._decide(clear=False)
        elif self._left <= 0:  # else no early decision, as on the fast path above
            self._decide(clear=False)

    def _clear_lead(self) -> bool:
        """Whether a challenger leads the leader by more than ``EARLY`` standard
        deviations in this window (integers: the test is exact)."""
        lead = self._leader
        own = self._shadows[lead].hits
        bar = EARLY * EARLY
        squares, pair = self._squares, self._pair
        for i, shadow in enumerate(self._shadows):
            ahead = shadow.hits - own
            if ahead > 0 and ahead * ahead > bar * squares[pair[i, lead]]:
                return True
        return False

    def _decayed(self) -> list[float]:
        """The scores as a decision now would make them."""
        return [
            score * DECAY + shadow.hits
            for score, shadow in zip(self._scores, self._shadows, strict=True)
        ]

    def _challenger(self, scores: list[float], clear: bool = False) -> int | None:
        """The shadow that takes the lead at a decision with these scores, if any: the
        first best, if it beats the leader's by ``MARGIN`` and (unless ``clear``, an
        ``EARLY`` decision) by ``SIGNIFICANCE`` standard deviations."""
        lead = self._leader
        best = max(range(len(self._shadows)), key=scores.__getitem__)
        ahead = scores[best] - scores[lead]
        if best == lead or scores[best] <= scores[lead] * (1 + MARGIN):
            return None
        if clear:
            return best
        p = self._pair[best, lead]
        spread = self._spreads[p] * (DECAY * DECAY) + self._squares[p]
        return best if ahead * ahead > SIGNIFICANCE * SIGNIFICANCE * spread * _ROUNDING else None

    def _decide(self, clear: bool) -> None:
        scores = self._scores = self._decayed()
        best = self._challenger(scores, clear)
        spreads = self._spreads
        for p, square in enumerate(self._squares):
            spreads[p] = spreads[p] * (DECAY * DECAY) + square
        for shadow in self._shadows:
            shadow.hits = 0
        if best is not None and best != self._leader:
            self._leader = best
            self._tier.lead(self._shadows[best])
        self._left = self._window
        self._squares = [0] * len(self._pairs)

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
