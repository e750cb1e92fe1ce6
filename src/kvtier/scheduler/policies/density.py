"""Hit density over prefix classes: evict the blocks least likely to be used per unit of time.

Runs in the scheduler; pure Python. LRU keeps what was used last, ARC what was used
twice; neither knows that a conversation that has had its last turn is never asked
again, that a document asked about twice is done, or that a system prompt many chats
continue is worth more than any one of them. This policy learns such facts from the
traffic, per *class* of block, and evicts by what it learned::

    observe(keys) ─► PrefixHistory: the request's generation g and shared prefix
                  ─► the class of each of its blocks (``request_class``): SHARED for
                     the shared prefix, else by (g, how deep it hit, last key or not)
                  ─► each resident block of the request: a hit at its age, for the
                     class it had (HitDensity), then it takes its new class
    choose_victims ─► the coldest evictable block of each class, ranked by
                      HitDensity.rank(class, age): the lowest density goes first

The class of a chain block (not shared) is made of three facts of the request that
last used it:

* its generation, exact up to 15, then in pairs, 24 and over together
  (``GENERATIONS`` buckets): how long this chain has gone on;
* how many of its leading blocks the tier held when it was looked up: 0-1, 2-7 or 8
  and more (``DEPTHS``): a request that hit deep continues a live chain, one that
  hit nothing starts a new one or comes back after its chain was evicted;
* whether it was the request's last block (``TAILS``): often a partial block that no
  later request shares (half the reuse of the others on the Mooncake trace).

The blocks of a request share a class but its last, so within a class the recency
order keeps a chain's head warmer than its tail (the first key is touched last).
Ages count looked-up keys: a block's age is how many keys were looked up since its
last use. Every ``UPDATE_KEYS`` looked-up keys the density tables are recomputed.

Each class is a ``RecencyList`` (held blocks parked). A search for victims peeks at
the coldest block of each class that holds any, keeps them in a heap by rank and
takes the lowest, then that class's next: O(classes + victims * log classes), not
O(pinned). ``docs/simulate.md`` has its cells against LRU and ARC.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Generator, Iterator, Sequence
from itertools import takewhile

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.hit_density import HitDensity
from kvtier.scheduler.policies.prefix_history import PrefixHistory
from kvtier.scheduler.policies.recency import RecencyList

GENERATIONS = 21
"""Generation buckets: 0-15 exact, then 16-17, 18-19, 20-21, 22-23, and 24 and over."""

DEPTHS = 3
"""Buckets of the request's hit depth: 0-1, 2-7, 8 and more blocks."""

TAILS = 2
"""A request's last block, or any other."""

SHARED = GENERATIONS * DEPTHS * TAILS
"""The class of shared-prefix blocks (branching points and the keys before them)."""

CLASSES = SHARED + 1

HISTORY = 4
"""The prefix history remembers between this many and twice as many capacities of keys."""

BUCKET_SHARE = 4
"""An age bucket is ``capacity // BUCKET_SHARE`` looked-up keys wide."""

UPDATE_KEYS = 4096
"""Looked-up keys between recomputations of the density tables."""


def generation_bucket(generation: int) -> int:
    """The generation's bucket (see ``GENERATIONS``)."""
    if generation < 16:
        return generation
    return min(16 + (generation - 16) // 2, GENERATIONS - 1)


def depth_bucket(depth: int) -> int:
    """The bucket of a hit depth (see ``DEPTHS``)."""
    return min(depth.bit_length() // 2, DEPTHS - 1)


def chain_class(generation: int, depth: int, tail: bool) -> int:
    """The class of a chain block (not shared) of a request."""
    return (generation_bucket(generation) * DEPTHS + depth_bucket(depth)) * TAILS + (not tail)


class DensityPolicy(EvictionPolicy):
    """Evict the lowest learned hit density among the coldest block of each class."""

    name = "density"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._lists: list[RecencyList[BlockHash]] = [RecencyList() for _ in range(CLASSES)]
        self._class: dict[BlockHash, int] = {}
        self._last: dict[BlockHash, int] = {}  # the looked-up keys' count at the last use
        self._history = PrefixHistory(HISTORY * capacity)
        self._density = HitDensity(CLASSES, max(1, capacity // BUCKET_SHARE))
        self._now = 0  # the looked-up keys' count before the last request: its time
        self._looked_up = 0
        self._next_update = UPDATE_KEYS
        # The last request's classes for blocks it stores: its tail key's, the others'.
        self._tail: BlockHash | None = None
        self._tail_class = self._body_class = chain_class(0, 0, tail=False)
        self._shared: frozenset[BlockHash] | tuple[()] = ()

    def __len__(self) -> int:
        return len(self._class)

    def __contains__(self, key: object) -> bool:
        return key in self._class

    def keys(self) -> Iterator[BlockHash]:
        return iter(list(self._class))

    def class_of(self, key: BlockHash) -> int:
        """The class of a resident block (for tests and diagnostics)."""
        return self._class[key]

    # -- learning ------------------------------------------------------------------

    def observe(self, keys: Sequence[BlockHash]) -> None:
        now = self._now = self._looked_up
        classes, last, lists, density = self._class, self._last, self._lists, self._density
        depth = len(list(takewhile(classes.__contains__, keys)))
        generation, last_shared = self._history.classify(keys)
        body = self._body_class = chain_class(generation, depth, tail=False)
        self._tail_class = body - 1
        self._tail = keys[-1] if keys else None
        self._shared = frozenset(keys[: last_shared + 1]) if last_shared >= 0 else ()
        end = len(keys) - 1
        for i, key in enumerate(keys):
            old = classes.get(key)
            if old is None:
                continue
            density.hit(old, now - last[key])
            last[key] = now
            new = SHARED if i <= last_shared else body if i < end else body - 1
            if new != old:
                lists[old].remove(key)
                lists[new].add(key)
                classes[key] = new
        self._looked_up = now + len(keys)
        if self._looked_up >= self._next_update:
            self._next_update = self._looked_up + UPDATE_KEYS
            density.update()

    # -- the policy protocol ------------------------------------------------------

    def _class_for_new(self, key: BlockHash) -> int:
        if key in self._shared:
            return SHARED
        return self._tail_class if key == self._tail else self._body_class

    def add(self, key: BlockHash) -> None:
        cls = self._class_for_new(key)
        self._lists[cls].add(key)
        self._class[key] = cls
        self._last[key] = self._now

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        if self._shared or self._tail in keys:
            for key in keys:
                self.add(key)
            return
        cls = self._body_class  # the usual store of a request's new blocks but its tail
        self._lists[cls].add_all(keys)
        self._class.update(dict.fromkeys(keys, cls))
        self._last.update(dict.fromkeys(keys, self._now))

    def touch(self, key: BlockHash, reused: bool) -> None:
        self._lists[self._class[key]].touch(key)
        self._last[key] = self._now

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        classes, lists, last, now = self._class, self._lists, self._last, self._now
        for key in keys:
            lists[classes[key]].touch(key)
            last[key] = now

    def remove(self, key: BlockHash) -> None:
        self._lists[self._class.pop(key)].remove(key)
        del self._last[key]

    def release(self, key: BlockHash) -> None:
        self._lists[self._class[key]].release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        classes, lists = self._class, self._lists
        for key in keys:
            lists[classes[key]].release(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        now, last, rank = self._now, self._last, self._density.rank
        searches: dict[int, Generator[BlockHash, None, None]] = {}
        heap: list[tuple[tuple[float, bool, int, float], int, BlockHash]] = []
        for cls, blocks in enumerate(self._lists):
            if blocks:
                search = searches[cls] = blocks.evictable(is_held, protected)
                key = next(search, None)
                if key is not None:
                    heap.append((rank(cls, now - last[key]), cls, key))
        heapq.heapify(heap)
        victims: list[BlockHash] = []
        try:
            while heap and len(victims) < n:
                _, cls, key = heapq.heappop(heap)
                victims.append(key)
                following = next(searches[cls], None)
                if following is not None:
                    heapq.heappush(heap, (rank(cls, now - last[following]), cls, following))
        finally:
            for search in searches.values():
                search.close()
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        classes, last, lists, evicted = self._class, self._last, self._lists, self._density.evicted
        now = self._now
        for key in victims:
            cls = classes.pop(key)
            evicted(cls, now - last.pop(key))
            lists[cls].remove(key)
