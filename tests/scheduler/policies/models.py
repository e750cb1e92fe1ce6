"""Reference models of the eviction policies, written plainly from their papers.

Test oracles only. Each model keeps its lists as Python lists, coldest first, and does
every step the slow, obvious way (``list.remove``, comprehensions), sharing no code
with ``kvtier.scheduler.policies`` beyond the ``EvictionPolicy`` interface it fills in.
The fast policies park held blocks, batch additions and trim ghosts in loops; the
models do none of that, so a mistake in that machinery shows as a difference.

What "evictable" means is the manager's business: a block is offered only when it is
not held (being stored, or pinned by a load) and not among the store's own keys. Every
model applies that filter to its exact recency order, which is what the fast
``RecencyList`` promises to reproduce.

kvtier's documented deviations from the papers (``policies/arc.py``, ``slru.py``),
and so the models':

* Blocks enter on ``add`` (a store) and a second use is ``touch(key, reused=True)``;
  a touch with ``reused=False`` (a block still being stored) is recency only.
* ARC: eviction happens before the incoming blocks are added, so ``choose_victims``
  first applies to ``p`` the adaptation the incoming keys that are ghosts will cause,
  one key after the other, with the ghost lists as they are. REPLACE takes T1's
  coldest block when ``|T1| > p`` (resident blocks, held ones included), else T2's,
  and falls back to the other list when the preferred one has nothing evictable
  (the paper's extra ``x in B2 and |T1| == p`` case is not used). A returning ghost
  goes straight to T2's MRU end. The ghost bounds ``|T1| + |B1| <= c`` and
  ``|T1| + |T2| + |B1| + |B2| <= 2c`` are restored after every add and eviction by
  dropping the oldest ghosts, B1's for the first bound, B2's first for the second.
  ``p`` moves by ``|B2| / |B1|`` (or ``|B1| / |B2|``) rounded down, at least 1.
* SLRU (Karedla et al.): probation then protected, protected at most ``int(0.9 c)``
  blocks (at least 1); overflow demotes protected's coldest block to probation's MRU
  end; victims come from probation first, then protected, coldest first; evicted keys
  are remembered in a FIFO ghost list of ``4 c`` keys, and a ghost stored again
  enters protected.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld

from .density_model import density_model


def _evictable(
    order: list[BlockHash], is_held: IsHeld, protected: Collection[BlockHash]
) -> list[BlockHash]:
    return [key for key in order if key not in protected and not is_held(key)]


def _to_mru(order: list[BlockHash], key: BlockHash) -> None:
    order.remove(key)
    order.append(key)


class LRUModel(EvictionPolicy):
    """Textbook LRU: one list; every use moves a block to the most recent end."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.order: list[BlockHash] = []

    def __len__(self) -> int:
        return len(self.order)

    def add(self, key: BlockHash) -> None:
        assert key not in self.order
        self.order.append(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.order:
            _to_mru(self.order, key)

    def remove(self, key: BlockHash) -> None:
        self.order.remove(key)

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        candidates = _evictable(self.order, is_held, protected)
        return candidates[:n] if len(candidates) >= n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            self.order.remove(key)


class ARCModel(EvictionPolicy):
    """ARC (Megiddo & Modha, FAST'03, Fig. 4) with kvtier's deviations (module doc)."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.t1: list[BlockHash] = []
        self.t2: list[BlockHash] = []
        self.b1: list[BlockHash] = []
        self.b2: list[BlockHash] = []
        self.p = 0

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return len(self.t1), len(self.t2), len(self.b1), len(self.b2)

    def _adapt(self, p: int, key: BlockHash) -> int:
        """The paper's adaptation for a hit on ghost ``key`` (Case II / Case III)."""
        c, b1, b2 = self.capacity, len(self.b1), len(self.b2)
        if key in self.b1:  # Case II: delta1 = 1 if |B1| >= |B2| else |B2| / |B1|
            delta = 1 if b1 >= b2 else b2 // b1
            return min(p + delta, c)
        if key in self.b2:  # Case III: delta2 = 1 if |B2| >= |B1| else |B1| / |B2|
            delta = 1 if b2 >= b1 else b1 // b2
            return max(p - delta, 0)
        return p

    def _bound_ghosts(self) -> None:
        c = self.capacity
        while len(self.t1) + len(self.b1) > c and self.b1:
            del self.b1[0]  # the oldest ghost of B1
        while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c:
            del (self.b2 if self.b2 else self.b1)[0]

    def add(self, key: BlockHash) -> None:
        assert key not in self.t1 and key not in self.t2
        if key in self.b1 or key in self.b2:
            self.p = self._adapt(self.p, key)
            (self.b1 if key in self.b1 else self.b2).remove(key)
            self.t2.append(key)
        else:
            self.t1.append(key)
        self._bound_ghosts()

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.t1 and reused:
            self.t1.remove(key)
            self.t2.append(key)
        elif key in self.t1:
            _to_mru(self.t1, key)
        elif key in self.t2:
            _to_mru(self.t2, key)

    def remove(self, key: BlockHash) -> None:
        (self.t1 if key in self.t1 else self.t2).remove(key)

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        p = self.p
        for key in incoming:
            p = self._adapt(p, key)
        t1 = _evictable(self.t1, is_held, protected)
        t2 = _evictable(self.t2, is_held, protected)
        t1_size = len(self.t1)
        victims: list[BlockHash] = []
        for _ in range(n):
            lists = (t1, t2) if t1_size > p else (t2, t1)  # REPLACE: is T1 over target?
            source = next((lst for lst in lists if lst), None)
            if source is None:
                return None
            victims.append(source.pop(0))
            if source is t1:
                t1_size -= 1
        return victims

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            if key in self.t1:
                self.t1.remove(key)
                self.b1.append(key)
            else:
                self.t2.remove(key)
                self.b2.append(key)
        self._bound_ghosts()


class SLRUModel(EvictionPolicy):
    """Segmented LRU (Karedla et al., 1994) with a FIFO ghost list for admission."""

    name = "slru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.probation: list[BlockHash] = []
        self.protected: list[BlockHash] = []
        self.ghost: list[BlockHash] = []
        self.protected_cap = max(1, int(0.9 * capacity))
        self.ghost_cap = 4 * capacity

    def __len__(self) -> int:
        return len(self.probation) + len(self.protected)

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.probation), len(self.protected), len(self.ghost)

    def _protect(self, key: BlockHash) -> None:
        self.protected.append(key)
        if len(self.protected) > self.protected_cap:
            self.probation.append(self.protected.pop(0))

    def add(self, key: BlockHash) -> None:
        assert key not in self.probation and key not in self.protected
        if key in self.ghost:
            self.ghost.remove(key)
            self._protect(key)
        else:
            self.probation.append(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.probation and reused:
            self.probation.remove(key)
            self._protect(key)
        elif key in self.probation:
            _to_mru(self.probation, key)
        elif key in self.protected:
            _to_mru(self.protected, key)

    def remove(self, key: BlockHash) -> None:
        (self.probation if key in self.probation else self.protected).remove(key)

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        candidates = _evictable(self.probation, is_held, protected) + _evictable(
            self.protected, is_held, protected
        )
        return candidates[:n] if len(candidates) >= n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            self.remove(key)
            self.ghost.append(key)
        while len(self.ghost) > self.ghost_cap:
            del self.ghost[0]


class BranchModel(EvictionPolicy):
    """Shared-prefix LRU (``policies/branch.py``), plainly: two recency lists, unshared
    and shared, a last-use time per block, two FIFO ghost lists of ``c`` keys each.

    ``observe`` learns, for each key but the last of a request, up to ``kids`` next
    keys; a key with ``kids`` next keys, or already shared, marks itself and every key
    before it in the request shared, and a marked block in the unshared list moves to
    the shared list's MRU end (keeping its time). What is learned lives in
    generations: when the current one holds more than ``generation`` keys, it becomes
    the old one and a new one starts with its keys of two next keys or more (unless
    they are more than half a generation), and the shared marks of keys not in the
    old one are dropped; a key looked up that is only in the old one moves back.

    ``add``: a ghost of the unshared list lowers ``p`` by max(1, |Gs| / (|Gu| + 1)),
    one of the shared list raises it by max(1, |Gu| / (|Gs| + 1)) (counted after it
    leaves); the block joins the shared list if marked, else the unshared one.
    Victims: the unshared list's evictable blocks coldest first, but while the shared
    list holds more than ``p`` blocks (counting each taken), the shared list's coldest
    evictable one goes instead when it is older; the shared list when the unshared one
    has none left.
    """

    name = "branch"

    def __init__(self, capacity: int, *, share: float, kids: int, generation: int) -> None:
        super().__init__(capacity)
        self.unshared: list[BlockHash] = []
        self.shared: list[BlockHash] = []
        self.time: dict[BlockHash, int] = {}
        self.clock = 0
        self.ghosts_u: list[BlockHash] = []
        self.ghosts_s: list[BlockHash] = []
        self.p = share * capacity
        self.kids = kids
        self.generation = generation
        self.nexts: dict[BlockHash, set[BlockHash]] = {}
        self.old: dict[BlockHash, set[BlockHash]] = {}
        self.marked: set[BlockHash] = set()

    def __len__(self) -> int:
        return len(self.unshared) + len(self.shared)

    @property
    def sizes(self) -> tuple[int, int]:
        return len(self.unshared), len(self.shared)

    def _stamp(self, key: BlockHash) -> None:
        self.clock += 1
        self.time[key] = self.clock

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if len(self.nexts) > self.generation:
            self.old = self.nexts
            forks = {key: seen for key, seen in self.old.items() if len(seen) >= 2}
            self.nexts = forks if len(forks) <= self.generation // 2 else {}
            self.marked = {key for key in self.marked if key in self.old}
        deepest = -1
        for i, key in enumerate(keys[:-1]):
            if key not in self.nexts:
                self.nexts[key] = self.old.pop(key) if key in self.old else set()
            if len(self.nexts[key]) < self.kids:
                self.nexts[key].add(keys[i + 1])
            if len(self.nexts[key]) >= self.kids or key in self.marked:
                deepest = i
        for key in keys[: deepest + 1]:
            if key not in self.marked:
                self.marked.add(key)
                if key in self.unshared:
                    self.unshared.remove(key)
                    self.shared.append(key)

    def add(self, key: BlockHash) -> None:
        assert key not in self.unshared and key not in self.shared
        if key in self.ghosts_u:
            self.ghosts_u.remove(key)
            self.p = max(0.0, self.p - max(1.0, len(self.ghosts_s) / (len(self.ghosts_u) + 1)))
        elif key in self.ghosts_s:
            self.ghosts_s.remove(key)
            self.p = min(
                float(self.capacity),
                self.p + max(1.0, len(self.ghosts_u) / (len(self.ghosts_s) + 1)),
            )
        (self.shared if key in self.marked else self.unshared).append(key)
        self._stamp(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        for segment in (self.unshared, self.shared):
            if key in segment:
                _to_mru(segment, key)
                self._stamp(key)

    def remove(self, key: BlockHash) -> None:
        (self.unshared if key in self.unshared else self.shared).remove(key)
        del self.time[key]

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        u = _evictable(self.unshared, is_held, protected)
        s = _evictable(self.shared, is_held, protected)
        shared_count = len(self.shared)
        victims: list[BlockHash] = []
        while len(victims) < n:
            take_s = not u or bool(
                shared_count > self.p and s and self.time[s[0]] < self.time[u[0]]
            )
            if take_s:
                if not s:
                    return None
                victims.append(s.pop(0))
                shared_count -= 1
            else:
                victims.append(u.pop(0))
        return victims

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            ghosts = self.ghosts_s if key in self.shared else self.ghosts_u
            self.remove(key)
            ghosts.append(key)
            if len(ghosts) > self.capacity:
                del ghosts[0]


def _branch_model(capacity: int) -> EvictionPolicy:
    """The model with the policy's constants (read, not shared, from the module)."""
    from kvtier.scheduler.policies import branch

    return BranchModel(
        capacity,
        share=branch.SHARE,
        kids=branch.KIDS,
        generation=max(branch.MIN_GENERATION, branch.PRUNE_FACTOR * capacity // 2),
    )


CANDIDATE_MODELS: tuple[Callable[[int], EvictionPolicy], ...] = (
    LRUModel,
    ARCModel,
    SLRUModel,
    _branch_model,
    density_model,
)
"""The leader's shadows' models, in ``leader.CANDIDATES``' order."""

CANDIDATE_NAMES = ("lru", "arc", "slru", "branch", "density")


class _ShadowModel:
    """A candidate's model over keys only, serving each looked-up request plainly."""

    def __init__(self, model: EvictionPolicy) -> None:
        self.model = model
        self.resident: list[BlockHash] = []
        self.hits = 0

    def serve(self, keys: Sequence[BlockHash]) -> tuple[list[BlockHash], list[BlockHash]]:
        """The manager's flow for one request: ``(evicted, stored)``."""
        self.model.observe(keys)
        hit = 0
        while hit < len(keys) and keys[hit] in self.resident:
            hit += 1
        self.hits += hit
        for key in keys[::-1]:
            if key in self.resident:
                self.model.touch(key, True)
        rest = list(keys[hit:])
        new: list[BlockHash] = []
        for key in rest:
            if key not in self.resident and key not in new:
                new.append(key)
        if not new or len(new) > self.model.capacity:
            return [], []
        victims: list[BlockHash] = []
        need = len(self.resident) + len(new) - self.model.capacity
        if need > 0:
            chosen = self.model.choose_victims(need, lambda key: False, rest, new)
            if chosen is None:
                return [], []
            victims = list(chosen)
            self.model.evict(victims)
            self.resident = [key for key in self.resident if key not in victims]
        for key in new:
            self.model.add(key)
            self.resident.append(key)
        for key in keys[::-1]:
            if key in self.resident:
                self.model.touch(key, key not in new)
        return victims, new


class LeaderModel(EvictionPolicy):
    """Follow the leader among LRU, ARC, SLRU, branch and (in step) density
    (``policies/leader.py``), plainly.

    The shadow models serve looked-up requests as the manager would. At ``rate``
    1 they see every request, at the tier's capacity, and the tier follows the leader
    in step: its blocks are in ``kept`` (the leading shadow holds them) or ``extra``
    (it does not), each a recency list; victims come from extra, then kept, coldest
    first. A block the leader evicts moves from kept to extra's MRU end; one it
    stores moves back.

    At ``rate`` R > 1 the shadows hold ``capacity // R`` keys and see only the
    requests whose first key's CRC-32 is 0 mod R, and the tier is a model of the
    leading policy itself. After a switch, at the next search for victims, a new
    model of the new leader's policy gets the tier's held blocks (sorted by key),
    then the others in the old model's eviction order.

    Every ``window`` looked-up keys, or every quarter of the capacity when that is
    more (divided by R: sampled keys), the scores are decayed and the shadows' hits
    added; the first best score takes the lead when it exceeds the leader's by the
    margin and by more than ``significance`` times the square root of the two's
    spread: the sum over every past request of the squared difference of their hits,
    weighted by ``decay`` squared per decision since (in step, the tier's blocks are
    then re-split in list order). A decision comes sooner, after any (sampled)
    request: when some shadow's hits since the last decision exceed the leader's by
    more than ``early`` times the square root of the sum, over those requests, of the
    squared difference of the two's hits (then the margin alone decides), or when a
    decision then would hand the lead over. (A lead within a relative 1e-9 of the
    bar is not over it: one request's difference is exactly one standard deviation.)

    In step, with a ``reserve`` share, the tier keeps up to ``max(1, round(reserve *
    capacity))`` blocks of extra that ARC's or SLRU's shadow holds ("guarded"): its
    victims are then extra's unguarded blocks, the guarded ones past that number (the
    least reused first, then the coldest), kept's unguarded blocks among its
    ``scan * need + 64`` coldest evictable ones, the other guarded ones, then kept's
    coldest. Reuses count from touches while the reserve lasts. It ends for good after
    the first request on which the ARC or SLRU shadow hit fewer keys than the leader,
    or the tier (its prefix of the request before the shadows served it) did, and at
    the first switch.
    """

    name = "leader"

    def __init__(
        self,
        capacity: int,
        *,
        start: int,
        window: int,
        decay: float,
        margin: float,
        early: float,
        significance: float,
        rate: int = 1,
        reserve: float = 0.0,
        scan: int = 64,
    ) -> None:
        super().__init__(capacity)
        self.rate = rate
        self.reserve = max(1, round(reserve * capacity)) if reserve > 0 and rate == 1 else 0
        self.scan = scan
        self.uses: dict[BlockHash, int] = {}
        # a sampled leader runs no density shadow (``leader.IN_STEP_ONLY``), the last one
        candidates = CANDIDATE_MODELS if rate == 1 else CANDIDATE_MODELS[:-1]
        self.shadows = [_ShadowModel(make(capacity // rate)) for make in candidates]
        self.leader = start
        self.followed = self.shadows[start]
        self.scores = [0.0] * len(self.shadows)
        self.window = max(1, max(window, capacity // 4) // rate)
        self.left = self.window
        self.decay = decay
        self.margin = margin
        self.early = early
        self.significance = significance
        self.since: list[tuple[int, ...]] = []  # per-request hits since deciding
        # per pair of shadows: the decisions' decayed sums of squared hit differences
        self.spreads = {
            (i, j): 0.0 for i in range(len(self.shadows)) for j in range(len(self.shadows))
        }
        self.kept: list[BlockHash] = []
        self.extra: list[BlockHash] = []
        self.tier = CANDIDATE_MODELS[start](capacity)
        self.resident: list[BlockHash] = []
        self.pending: int | None = None  # the leader the sampled tier has not taken on

    def __len__(self) -> int:
        return len(self.resident) if self.rate > 1 else len(self.kept) + len(self.extra)

    @property
    def sizes(self) -> tuple[int, ...]:
        if self.rate > 1:
            return getattr(self.tier, "sizes", (len(self.tier),))
        return len(self.extra), len(self.kept)

    @property
    def follows(self) -> str:
        return self.tier.name if self.rate > 1 else self.followed.model.name

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if not keys:
            return
        if self.rate > 1:
            self.tier.observe(keys)  # a sampled tier's policy learns every request
        if zlib.crc32(keys[0]) % self.rate != 0:
            return
        tier = set(self.kept) | set(self.extra)
        tier_hit = 0
        while tier_hit < len(keys) and keys[tier_hit] in tier:
            tier_hit += 1
        leader_before = self.leader
        before = [shadow.hits for shadow in self.shadows]
        for shadow in self.shadows:
            evicted, stored = shadow.serve(keys)
            if shadow is not self.followed or self.rate > 1:
                continue
            for key in evicted:
                if key in self.kept:
                    self.kept.remove(key)
                    self.extra.append(key)
            for key in stored:
                if key in self.extra:
                    self.extra.remove(key)
                    self.kept.append(key)
        gained = [shadow.hits - hits for shadow, hits in zip(self.shadows, before, strict=True)]
        if self.reserve and min(gained[1], gained[2], tier_hit) < gained[leader_before]:
            self.reserve, self.uses = 0, {}  # shadows 1 and 2: ARC and SLRU
        self.since.append(tuple(gained))
        self.left -= len(keys)
        ends = self.left <= 0
        clear = not ends and self._clearly_led()
        scores = [
            score * self.decay + shadow.hits
            for score, shadow in zip(self.scores, self.shadows, strict=True)
        ]
        spreads = {
            (i, j): spread * self.decay**2 + sum((hits[i] - hits[j]) ** 2 for hits in self.since)
            for (i, j), spread in self.spreads.items()
        }
        best = scores.index(max(scores))
        lead = scores[best] - scores[self.leader]
        switch = (
            best != self.leader
            and scores[best] > scores[self.leader] * (1 + self.margin)
            and (
                clear
                or lead > self.significance * math.sqrt(spreads[best, self.leader] * (1 + 1e-9))
            )
        )
        if ends or clear or switch:
            self.since = []
            self.scores, self.spreads = scores, spreads
            for shadow in self.shadows:
                shadow.hits = 0
            if switch:
                self.leader = best
                self.reserve, self.uses = 0, {}
                if self.rate > 1:
                    self.pending = best
            self.left = self.window
        if self.rate == 1:
            followed = self.shadows[self.leader]
            if followed is not self.followed:
                self.followed = followed
                holds = followed.resident
                leaving = [key for key in self.kept if key not in holds]
                self.kept = [key for key in self.kept if key in holds]
                self.extra += leaving
                joining = [key for key in self.extra if key in holds]
                self.extra = [key for key in self.extra if key not in holds]
                self.kept += joining

    def _clearly_led(self) -> bool:
        for other in range(len(self.shadows)):
            lead = sum(hits[other] - hits[self.leader] for hits in self.since)
            spread = math.sqrt(sum((hits[other] - hits[self.leader]) ** 2 for hits in self.since))
            if lead > 0 and lead > self.early * spread:
                return True
        return False

    def add(self, key: BlockHash) -> None:
        assert key not in self.kept and key not in self.extra and key not in self.resident
        if self.rate > 1:
            self.resident.append(key)
            self.tier.add(key)
        elif key in self.followed.resident:
            self.kept.append(key)
        else:
            self.extra.append(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if self.rate > 1:
            self.tier.touch(key, reused)
            return
        for segment in (self.kept, self.extra):
            if key in segment:
                _to_mru(segment, key)
        if reused and self.reserve:
            self.uses[key] = self.uses.get(key, 0) + 1

    def remove(self, key: BlockHash) -> None:
        if self.rate > 1:
            self.resident.remove(key)
            self.tier.remove(key)
        else:
            (self.kept if key in self.kept else self.extra).remove(key)
            self.uses.pop(key, None)

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        if self.rate > 1:
            if self.pending is not None:
                if CANDIDATE_NAMES[self.pending] != self.tier.name:
                    held = sorted(key for key in self.resident if is_held(key))
                    free = len(self.resident) - len(held)
                    order = self.tier.choose_victims(free, is_held, (), ()) if free else []
                    assert order is not None
                    self.tier = CANDIDATE_MODELS[self.pending](self.capacity)
                    for key in held + order:
                        self.tier.add(key)
                self.pending = None
            return self.tier.choose_victims(n, is_held, protected, incoming)
        extra = _evictable(self.extra, is_held, protected)
        kept = _evictable(self.kept, is_held, protected)
        if not self.reserve:
            candidates = extra + kept
            return candidates[:n] if len(candidates) >= n else None

        def guarded(key: BlockHash) -> bool:
            return key in self.shadows[1].resident or key in self.shadows[2].resident

        victims = [key for key in extra if not guarded(key)][:n]
        reserved = sorted(
            (key for key in extra if guarded(key)), key=lambda key: self.uses.get(key, 0)
        )
        over = max(0, len(reserved) - self.reserve)
        victims += reserved[: min(over, n - len(victims))]
        reserved = reserved[over:]
        need = n - len(victims)
        victims += [key for key in kept[: self.scan * need + 64] if not guarded(key)][:need]
        victims += reserved[: n - len(victims)]
        victims += [key for key in kept if key not in victims][: n - len(victims)]
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        if self.rate > 1:
            for key in victims:
                self.resident.remove(key)
            self.tier.evict(victims)
            return
        for key in victims:
            self.remove(key)


def _leader_model(capacity: int) -> EvictionPolicy:
    """The model with the policy's tuned constants (read, not shared, from the module)
    and its sampling rate (R = 1 for every capacity the suites use, unless a test
    lowers ``sampling``'s thresholds)."""
    from kvtier.scheduler.policies import leader, sampling

    return LeaderModel(
        capacity,
        start=leader.START,
        window=leader.WINDOW_MIN,
        decay=leader.DECAY,
        margin=leader.MARGIN,
        early=leader.EARLY,
        significance=leader.SIGNIFICANCE,
        rate=sampling.sample_rate(capacity),
        reserve=leader.RESERVE,
        scan=leader.RESERVE_SCAN,
    )


MODELS: dict[str, Callable[[int], EvictionPolicy]] = {
    "lru": LRUModel,
    "arc": ARCModel,
    "slru": SLRUModel,
    "leader": _leader_model,
    "density": density_model,
}
"""Each registered policy's reference model, by policy name."""
