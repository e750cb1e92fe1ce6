"""Hit density over prefix classes: evict the blocks least likely to be used per unit of time.

Runs in the scheduler; pure Python. LRU keeps what was used last, ARC what was used
twice; neither knows that a conversation that has had its last turn is never asked
again, that a document asked about twice is done, or that a system prompt many chats
continue is worth more than any one of them. This policy learns such facts from the
traffic, per *class* of block, and evicts by what it learned::

    observe(keys) ─► PrefixHistory: the request's generation g and shared prefix
                  ─► class of its blocks: SHARED for the shared prefix, else min(g, GEN_CAP)
                  ─► each resident block of the request: a hit at its age, for the
                     class it had (HitDensity), then it takes the request's class
    choose_victims ─► the coldest evictable block of each class, ranked by
                      HitDensity.rank(class, age): the lowest density goes first

A request's blocks share its class, so within a class the recency order keeps a
chain's head warmer than its tail (the first key is touched last) and tails go first.
Ages count looked-up keys: a block's age is how many keys were looked up since its
last use. Every ``UPDATE_KEYS`` looked-up keys the density tables are recomputed.

Each class is a ``RecencyList`` (held blocks parked), so a search for victims costs
O(classes + victims * log classes), not O(pinned). ``docs/simulate.md`` has its
cells against LRU and ARC (issue 14).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Generator, Iterator, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.hit_density import HitDensity
from kvtier.scheduler.policies.prefix_history import PrefixHistory
from kvtier.scheduler.policies.recency import RecencyList

GEN_CAP = 24
"""Generations from this one on share a class."""

SHARED = GEN_CAP + 1
"""The class of shared-prefix blocks (branching points and the keys before them)."""

CLASSES = SHARED + 1

HISTORY = 4
"""The prefix history remembers between this many and twice as many capacities of keys."""

BUCKET_SHARE = 4
"""An age bucket is ``capacity // BUCKET_SHARE`` looked-up keys wide."""

UPDATE_KEYS = 4096
"""Looked-up keys between recomputations of the density tables."""


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
        self._incoming = 0  # the class of the last request's new blocks
        self._shared: frozenset[BlockHash] | Collection[BlockHash] = ()

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
        generation, last_shared = self._history.classify(keys)
        cls = min(generation, GEN_CAP)
        self._incoming = cls
        self._shared = frozenset(keys[: last_shared + 1]) if last_shared >= 0 else ()
        classes, last, lists, density = self._class, self._last, self._lists, self._density
        for i, key in enumerate(keys):
            old = classes.get(key)
            if old is None:
                continue
            density.hit(old, now - last[key])
            last[key] = now
            new = SHARED if i <= last_shared else cls
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
        return SHARED if key in self._shared else self._incoming

    def add(self, key: BlockHash) -> None:
        cls = self._class_for_new(key)
        self._lists[cls].add(key)
        self._class[key] = cls
        self._last[key] = self._now

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        if self._shared:
            for key in keys:
                self.add(key)
            return
        cls = self._incoming
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
        searches: list[Generator[BlockHash, None, None]] = []
        heap: list[tuple[tuple[float, bool, int, float], int, BlockHash]] = []
        for cls, blocks in enumerate(self._lists):
            if blocks:
                search = blocks.evictable(is_held, protected)
                searches.append(search)
                key = next(search, None)
                if key is not None:
                    heap.append((rank(cls, now - last[key]), cls, key))
            else:
                searches.append(_NOTHING)
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
            for search in searches:
                search.close()
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[BlockHash]) -> None:
        classes, last, lists, evicted = self._class, self._last, self._lists, self._density.evicted
        now = self._now
        for key in victims:
            cls = classes.pop(key)
            evicted(cls, now - last.pop(key))
            lists[cls].remove(key)


def _nothing() -> Generator[BlockHash, None, None]:
    yield from ()


_NOTHING = _nothing()
"""An exhausted search, for the classes with no blocks (closing it again is harmless)."""
_NOTHING.close()
