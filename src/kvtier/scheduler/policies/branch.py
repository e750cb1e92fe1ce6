"""Shared-prefix LRU: the blocks of prompts that many requests continue are kept longer.

Runs in the scheduler; pure Python. ``leader`` runs it as a fourth shadow beside LRU,
ARC and SLRU (``policies/leader.py``); it is not registered on its own.

Prefix keys are chained: a request's keys are a path from its first block. A key that
lookups have shown followed by ``KIDS`` different next keys is a *branching point* --
a system or tool prompt that several conversations continue -- and so is every key
before it in such a request: those keys are *shared*. One conversation's history
(each key has one next key) and a document asked about twice (two next keys) are not.
LRU and ARC cannot tell them apart: a shared prompt is reused often, but so is every
turn's history. The blocks sit in two recency lists::

    unshared (LRU) ──► evicted first
    shared   (LRU) ──► spared while it holds at most p blocks; over p, the older
                       of the two lists' coldest blocks goes (LRU between them)

``p`` adapts as ARC's target for T1 (Megiddo and Modha, FAST'03): a key stored again
while it is a ghost of the unshared list (evicted from it lately) lowers ``p`` by
max(1, |shared ghosts| / |unshared ghosts|), one the shared list evicted raises it by
the inverse ratio; ghosts of at most the tier's capacity each; ``p`` starts at
``SHARE`` of the tier. The structure is learned in ``observe`` (every looked-up
request, before its blocks are used or stored), up to ``KIDS`` next keys per key.

Memory is bounded, by generations: the learned next keys are kept for the keys
looked up in this generation and the last; a generation ends when it has learned
``PRUNE_FACTOR / 2`` x capacity keys, and the next starts with the forks only (keys
with two next keys or more: a few prompts, kept while they fill at most half a
generation). So at most ``PRUNE_FACTOR`` x capacity keys are remembered (plus two
requests', and a cache of whole requests already learned: at most a generation's
worth of keys), and the few keys a branching point needs survive the churn of
conversation histories (aging them with the rest cost ``chat`` at 1 % 0.9 points). A
key's shared mark lasts while it is remembered. Sampled by first key
(``sampling.is_sampled``), a shadow sees every request of a root or none, so a
prefix and its continuations are learned together. Held blocks are parked
(``RecencyList``): eviction cost does not grow with pins.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import count

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import IsHeld
from kvtier.scheduler.policies.ghosts import GhostList
from kvtier.scheduler.policies.segmented import SegmentedPolicy
from kvtier.scheduler.policies.timed import TimedRecencyList

SHARE = 0.5
"""The shared list's target at the start, as a share of the tier."""

KIDS = 3
"""Different next keys that make a key a branching point (2 would mark every document
asked about twice)."""

PRUNE_FACTOR = 4
"""Learned keys remembered at most, as a multiple of the capacity (two generations)."""

MIN_GENERATION = 64
"""Keys a generation learns at least (a tiny tier's would age at every request)."""


class SharedPrefixPolicy(SegmentedPolicy):
    """LRU with the blocks of shared prefixes spared up to an adaptive target."""

    name = "branch"

    def __init__(self, capacity: int) -> None:
        clock = count()
        self._unshared: TimedRecencyList[BlockHash] = TimedRecencyList(clock)
        self._shared: TimedRecencyList[BlockHash] = TimedRecencyList(clock)
        super().__init__(capacity, (self._unshared, self._shared))
        self._ghost_unshared = GhostList()
        self._ghost_shared = GhostList()
        self._target = SHARE * capacity
        self._next: dict[BlockHash, set[BlockHash]] = {}  # key -> next keys seen (<= KIDS)
        self._old: dict[BlockHash, set[BlockHash]] = {}  # the previous generation's
        # (key, next key) pairs learned in this generation: a request made only of them,
        # with no shared key, teaches nothing (``observe``'s fast path)
        self._pairs: set[tuple[BlockHash, BlockHash]] = set()
        # whole requests all of whose pairs are in ``_pairs`` (a cache of it, emptied
        # with it; at most a generation's worth of keys): a request seen again is
        # found by one tuple hash, not a tuple per pair
        self._known: set[tuple[BlockHash, ...]] = set()
        self._known_keys = 0
        self._is_shared: set[BlockHash] = set()
        self._generation = max(MIN_GENERATION, PRUNE_FACTOR * capacity // 2)  # keys learned

    @property
    def sizes(self) -> tuple[int, int]:
        """``(|unshared|, |shared|)``, for tests and diagnostics."""
        return len(self._unshared), len(self._shared)

    @property
    def target(self) -> float:
        """``p``: blocks the shared list may hold before it competes by last use."""
        return self._target

    @property
    def learned(self) -> int:
        """Keys whose next keys are remembered (bounded: see the module's docstring)."""
        return len(self._next)

    def is_shared(self, key: BlockHash) -> bool:
        """Whether ``key`` is known to lie on a shared prefix."""
        return key in self._is_shared

    def observe(self, keys: Sequence[BlockHash]) -> None:
        """Learn the request's next keys; mark (and move to the shared list) every key
        up to its deepest branching point or already shared key."""
        if len(self._next) > self._generation:
            self._age()
        shared, request = self._is_shared, tuple(keys)
        known = request in self._known  # every pair learned: new only if something is shared
        if known and (not shared or shared.isdisjoint(request[:-1])):
            return  # the usual case: nothing new, nothing shared
        nexts, old, head = self._next, self._old, keys[:-1]
        if not known and self._pairs.issuperset(zip(head, keys[1:], strict=True)):
            self._remember(request)
            if not shared or shared.isdisjoint(head):
                return  # nothing new, nothing shared (C-level passes)
        deepest = -1
        for i in range(len(keys) - 1):
            key = keys[i]
            seen = nexts.get(key)
            if seen is None:
                seen = nexts[key] = old.pop(key) if key in old else set()
            if len(seen) < KIDS:
                seen.add(keys[i + 1])
            if len(seen) >= KIDS or key in shared:
                deepest = i
        if len(self._pairs) > self._generation:
            self._pairs.clear()  # a cache: what it forgets is looked at again
            self._forget_known()
        self._pairs.update(zip(head, keys[1:], strict=True))
        self._remember(request)
        if deepest < 0:
            return
        new = [key for key in keys[: deepest + 1] if key not in shared]
        shared.update(new)
        moving = self._unshared.members(dict.fromkeys(new))
        if moving:
            self._unshared.transfer(moving, self._shared)

    def _remember(self, request: tuple[BlockHash, ...]) -> None:
        """Note a request all of whose pairs are in ``_pairs`` now."""
        self._known_keys += len(request)
        if self._known_keys > self._generation:  # bounded like ``_pairs``
            self._forget_known()
            self._known_keys = len(request)
        self._known.add(request)

    def _forget_known(self) -> None:
        self._known = set()
        self._known_keys = 0

    def _age(self) -> None:
        """Start a new generation: the keys looked up during neither this one nor the
        last are forgotten (their next keys and their shared mark), but for the forks
        (keys with two next keys or more: few) while they fill at most half a
        generation."""
        old = self._old = self._next
        self._pairs = set()
        self._forget_known()
        forks = {key: seen for key, seen in old.items() if len(seen) > 1}
        self._next = forks if len(forks) <= self._generation // 2 else {}
        self._is_shared = {key for key in self._is_shared if key in old}

    def add(self, key: BlockHash) -> None:
        ghosts_u, ghosts_s = self._ghost_unshared, self._ghost_shared
        if key in ghosts_u:
            ghosts_u.remove(key)
            self._target = max(0.0, self._target - max(1.0, len(ghosts_s) / (len(ghosts_u) + 1)))
        elif key in ghosts_s:
            ghosts_s.remove(key)
            self._target = min(
                float(self.capacity), self._target + max(1.0, len(ghosts_u) / (len(ghosts_s) + 1))
            )
        (self._shared if key in self._is_shared else self._unshared).add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._shared:
            self._shared.touch(key)
        else:
            self._unshared.touch(key)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        """The first two runs of keys in one list are touched in one pass each
        (a request's shared prompt, then its history); the keys after them (more runs,
        or parked keys) one by one, so the work stays linear in ``len(keys)`` whatever
        is parked or however the keys alternate between the lists."""
        if not keys:
            return
        shared, unshared = self._shared, self._unshared
        # the shared prompt, then the history: a pass each
        i = (shared if keys[0] in shared else unshared).touch_listed(keys)
        n = len(keys)
        if i == n:
            return
        rest = keys[i:]
        i += (shared if rest[0] in shared else unshared).touch_listed(rest)
        for key in keys[i:]:  # more runs, or parked keys: one by one
            self.touch(key, True)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        if n <= 0:  # nothing to choose (``leader``'s shadows never ask; callers may)
            return []
        unshared, shared = self._unshared, self._shared
        over = len(shared) - self._target  # the shared list competes while over p
        if over <= 0:
            victims = unshared.coldest(n, is_held, protected)
            if victims is not None:
                return victims
        cold_u = unshared.evictable(is_held, protected)
        cold_s = shared.evictable(is_held, protected)
        try:
            u = next(cold_u, None)
            s = next(cold_s, None)
            victims = []
            while True:  # the next candidate of a list is asked for only when needed
                if u is None or (over > 0 and s is not None and shared.time(s) < unshared.time(u)):
                    if s is None:
                        return None
                    victims.append(s)
                    over -= 1
                    if len(victims) == n:
                        return victims
                    s = next(cold_s, None)
                else:
                    victims.append(u)
                    if len(victims) == n:
                        return victims
                    u = next(cold_u, None)
        finally:
            cold_u.close()
            cold_s.close()

    def evict(self, victims: Sequence[BlockHash]) -> None:
        shared = self._shared
        from_shared = shared.members(victims)
        if from_shared:
            shared.remove_all(from_shared)
            gone = set(from_shared)
            from_unshared = [key for key in victims if key not in gone]
        else:
            from_unshared = list(victims)
        self._unshared.remove_all(from_unshared)
        for ghosts, keys in (
            (self._ghost_unshared, from_unshared),
            (self._ghost_shared, from_shared),
        ):
            if keys:
                ghosts.update(keys)
                ghosts.pop_oldest(len(ghosts) - self.capacity)
