"""A plain reference model of the ``density`` policy, written from its definition.

Test oracle only (``policies/density.py``, ``hit_density.py``, ``prefix_history.py``):
Python lists per class (coldest first), a dict of times, the history as a dict of
``(generation, set of next keys)``, and each density computed by its defining sum
(``sum(H[x]) / sum((x - a + 1) * (H[x] + E[x]))`` over ``x >= a``), not by the policy's
backward pass, each class's counts plus ``prior_events`` pseudo-events spread as the
sum of all classes' counts (no update while that sum is under ``negligible``).
Victims: the coldest evictable block of each class, the one of lowest ``(density,
alive, -age, density at age 0, class)`` first, again and again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld


class DensityModel(EvictionPolicy):
    """The ``density`` policy, plainly."""

    name = "density"

    def __init__(
        self,
        capacity: int,
        *,
        history: int,
        bucket_share: int,
        update_keys: int,
        buckets: int,
        decay: float,
        dead_share: float,
        prior_events: float,
        negligible: float,
    ) -> None:
        super().__init__(capacity)
        self.shared_class = 21 * 3 * 2  # after every chain class
        self.limit = history * capacity
        self.width = max(1, capacity // bucket_share)
        self.update_keys, self.buckets = update_keys, buckets
        self.decay, self.dead_share, self.prior_events = decay, dead_share, prior_events
        self.negligible = negligible
        classes = self.shared_class + 1
        self.order: list[list[BlockHash]] = [[] for _ in range(classes)]
        self.cls: dict[BlockHash, int] = {}
        self.time: dict[BlockHash, int] = {}
        self.current: dict[BlockHash, tuple[int, set[BlockHash]]] = {}
        self.old: dict[BlockHash, tuple[int, set[BlockHash]]] = {}
        self.hits = [[0.0] * buckets for _ in range(classes)]
        self.evictions = [[0.0] * buckets for _ in range(classes)]
        self.tables = [[1.0 / (b + 1) for b in range(buckets)] for _ in range(classes)]
        self.floor = 0.0
        self.now = self.looked_up = 0
        self.next_update = update_keys
        self.body = self.tail_class = 1  # generation 0, depth 0, not a tail
        self.tail: BlockHash | None = None
        self.shared: set[BlockHash] = set()

    def __len__(self) -> int:
        return len(self.cls)

    def __contains__(self, key: object) -> bool:
        return key in self.cls

    @staticmethod
    def chain_class(generation: int, depth: int, tail: bool) -> int:
        """Generations 0-15, 16-17, 18-19, 20-21, 22-23, 24+; depths 0-1, 2-7, 8+."""
        g = generation if generation < 16 else min(16 + (generation - 16) // 2, 20)
        d = 0 if depth < 2 else 1 if depth < 8 else 2
        return (g * 3 + d) * 2 + (0 if tail else 1)

    # -- the prefix history ----------------------------------------------------------

    def _classify(self, keys: Sequence[BlockHash]) -> tuple[int, int]:
        generation = 0
        for key in reversed(keys):
            entry = self.current.get(key) or self.old.get(key)
            if entry is not None:
                generation = entry[0] + 1
                break
        last_shared = -1
        for i, key in enumerate(keys):
            if key in self.old:
                self.current[key] = self.old.pop(key)
            if key not in self.current:
                self.current[key] = (generation, set())
            nexts = self.current[key][1]
            if i + 1 < len(keys):
                nexts.add(keys[i + 1])
            if len(nexts) >= 2:
                last_shared = i
        if len(self.current) > self.limit:
            self.old, self.current = self.current, {}
        return generation, last_shared

    # -- densities -----------------------------------------------------------------

    def _bucket(self, age: int) -> int:
        return min(age // self.width, self.buckets - 1)

    def _update(self) -> None:
        classes = range(len(self.order))
        pool_hits = [sum(self.hits[c][b] for c in classes) for b in range(self.buckets)]
        pool_evictions = [sum(self.evictions[c][b] for c in classes) for b in range(self.buckets)]
        pool = sum(pool_hits) + sum(pool_evictions)
        if pool < self.negligible:
            return
        w = self.prior_events / pool
        best = 0.0
        for c in classes:
            own = sum(self.hits[c]) + sum(self.evictions[c]) > 0
            hits = [h + w * p for h, p in zip(self.hits[c], pool_hits, strict=True)]
            evictions = [e + w * p for e, p in zip(self.evictions[c], pool_evictions, strict=True)]
            for a in range(self.buckets):
                time = sum((x - a + 1) * (hits[x] + evictions[x]) for x in range(a, self.buckets))
                self.tables[c][a] = sum(hits[a:]) / time if time > 0 else 0.0
            if own:
                best = max(best, self.tables[c][0])
            self.hits[c] = [h * self.decay for h in self.hits[c]]
            self.evictions[c] = [e * self.decay for e in self.evictions[c]]
        self.floor = self.dead_share * best

    def _rank(self, key: BlockHash) -> tuple[float, bool, int, float, int]:
        c = self.cls[key]
        age = self.now - self.time[key]
        table = self.tables[c]
        return (table[self._bucket(age)], table[0] >= self.floor, -age, table[0], c)

    # -- the policy ------------------------------------------------------------------

    def observe(self, keys: Sequence[BlockHash]) -> None:
        self.now = self.looked_up
        depth = 0
        while depth < len(keys) and keys[depth] in self.cls:
            depth += 1
        generation, last_shared = self._classify(keys)
        self.body = self.chain_class(generation, depth, tail=False)
        self.tail_class = self.chain_class(generation, depth, tail=True)
        self.tail = keys[-1] if keys else None
        self.shared = set(keys[: last_shared + 1])
        for i, key in enumerate(keys):
            if key not in self.cls:
                continue
            old = self.cls[key]
            self.hits[old][self._bucket(self.now - self.time[key])] += 1
            self.time[key] = self.now
            if i <= last_shared:
                new = self.shared_class
            else:
                new = self.tail_class if i == len(keys) - 1 else self.body
            if new != old:
                self.order[old].remove(key)
                self.order[new].append(key)
                self.cls[key] = new
        self.looked_up = self.now + len(keys)
        if self.looked_up >= self.next_update:
            self.next_update = self.looked_up + self.update_keys
            self._update()

    def add(self, key: BlockHash) -> None:
        if key in self.shared:
            c = self.shared_class
        else:
            c = self.tail_class if key == self.tail else self.body
        self.order[c].append(key)
        self.cls[key] = c
        self.time[key] = self.now

    def touch(self, key: BlockHash, reused: bool) -> None:
        order = self.order[self.cls[key]]
        order.remove(key)
        order.append(key)
        self.time[key] = self.now

    def remove(self, key: BlockHash) -> None:
        self.order[self.cls.pop(key)].remove(key)
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
        queues = [
            [key for key in order if key not in protected and not is_held(key)]
            for order in self.order
        ]
        victims: list[BlockHash] = []
        while len(victims) < n:
            heads = [queue[0] for queue in queues if queue]
            if not heads:
                return None
            key = min(heads, key=self._rank)
            queues[self.cls[key]].pop(0)
            victims.append(key)
        return victims

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            c = self.cls[key]
            self.evictions[c][self._bucket(self.now - self.time[key])] += 1
            self.remove(key)


def density_model(capacity: int) -> EvictionPolicy:
    """The model with the policy's constants (read, not shared, from the modules)."""
    from kvtier.scheduler.policies import density, hit_density

    return DensityModel(
        capacity,
        history=density.HISTORY,
        bucket_share=density.BUCKET_SHARE,
        update_keys=density.UPDATE_KEYS,
        buckets=hit_density.BUCKETS,
        decay=hit_density.DECAY,
        dead_share=hit_density.DEAD_SHARE,
        prior_events=hit_density.PRIOR_EVENTS,
        negligible=hit_density.NEGLIGIBLE,
    )
