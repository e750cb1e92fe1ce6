"""``EvictionPolicy``: the strategy a ``TierManager`` asks which blocks to evict.

Runs in the scheduler; pure Python. The manager owns everything else — block states,
pins, slots, capacity, events — and tells the policy only what it needs:

* ``add(key)``: a new block entered the tier (it is being stored).
* ``touch(key, reused)``: a block was used. ``reused`` is False for a block still being
  stored (recency only: that is not a second use).
* ``remove(key)``: a block left without being evicted (its store failed).
* ``release(key)``: a block that was held (storing or pinned) is evictable again.
* ``observe(keys)``: a request looked up these keys (a policy may learn from it).
* ``add_all`` / ``release_all`` / ``touch_all``: the same for a batch, in order (the
  manager calls these; the base class loops, a policy may do better).
* ``choose_victims(n, is_held, protected, incoming)``: pick ``n`` evictable blocks, or
  ``None`` if there are not enough. Nothing observable changes; the manager then
  calls ``evict(victims)`` to commit, so eviction is all or nothing.

Adding a policy is one file: subclass, implement these, and register it in
``kvtier.scheduler.policies.POLICIES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence, Set
from operator import itemgetter
from typing import Any

from kvtier.blocks import BlockHash

IsHeld = Callable[[BlockHash], bool]


class HeldBlocks:
    """The manager's ``is_held``: a block being stored, or pinned by a load.

    The manager keeps the few STORING blocks in a set (they change on every store) and
    each block's pins in its slot map, whose value is the slot, or ``(slot, pins)`` for
    a pinned block, with the number of pinned blocks in ``n_pinned``; it changes them
    in place, this only reads them. Called with a key it answers for one block (a
    Python call); ``any_of`` answers for a batch in C-level passes
    (``RecencyList.coldest`` uses it). The pins of a batch are read from the slot map's
    entries of those keys -- the entries eviction pops next, so the test costs no cache
    miss of its own, where a separate set of pinned keys cost one per key.
    """

    __slots__ = ("_slots", "_storing", "n_pinned")

    def __init__(self, storing: Set[BlockHash], slots: Mapping[BlockHash, object]) -> None:
        self._storing = storing
        self._slots = slots
        self.n_pinned = 0  # blocks with a pin; kept by the manager

    def __call__(self, key: object) -> bool:
        return key in self._storing or (
            self.n_pinned > 0 and type(self._slots.get(key)) is tuple  # type: ignore[call-overload]
        )

    def any_of(self, keys: Sequence[object]) -> bool:
        """Whether some of ``keys`` (resident) is held. Nothing is asked when nothing
        is stored or pinned: ``isdisjoint`` of a set and a list hashes and looks up
        every key even when the set is empty (no stores in flight: the usual case).
        Pins are found by ``sum`` of the keys' entries: ints add up in C, a pinned
        block's tuple raises. ``itemgetter(*keys)`` reads the entries in one call, where
        ``map`` pays a call per key (~60 instructions per key more, by cachegrind)."""
        storing = self._storing
        if storing and not storing.isdisjoint(keys):
            return True
        if self.n_pinned:
            try:
                sum(get_all(self._slots, keys))
            except TypeError:
                return True
        return False


def get_all(table: Mapping[Any, Any], keys: Sequence[Any]) -> Sequence[Any]:
    """``[table[k] for k in keys]`` in one C call (``itemgetter``: no call per key; a
    lone key's value comes back bare, hence the cases). Raises ``KeyError``."""
    if len(keys) > 1:
        return itemgetter(*keys)(table)  # type: ignore[no-any-return]
    return [table[keys[0]]] if keys else []


class EvictionPolicy(ABC):
    """Decides eviction order for one tier of ``capacity`` blocks."""

    name: str = ""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def add(self, key: BlockHash) -> None:
        """A new block entered the tier (state STORING)."""

    @abstractmethod
    def touch(self, key: BlockHash, reused: bool) -> None:
        """A resident block was used; ``reused`` is False for a block being stored."""

    @abstractmethod
    def remove(self, key: BlockHash) -> None:
        """A resident block left the tier without eviction (failed store)."""

    @abstractmethod
    def release(self, key: BlockHash) -> None:
        """A resident block that was held is evictable again."""

    def add_all(self, keys: Sequence[BlockHash]) -> None:
        """``add`` each key, in order (a policy may do it faster)."""
        for key in keys:
            self.add(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        """``release`` each key (a policy may do it faster)."""
        for key in keys:
            self.release(key)

    def touch_all(self, keys: Sequence[BlockHash], storing: Collection[BlockHash]) -> None:
        """``touch`` each key, in order (each resident): recency only for keys in
        ``storing`` (still being stored), a reuse for the others. A policy may do it
        faster."""
        for key in keys:
            self.touch(key, key not in storing)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        """A request looked up ``keys`` (its whole prefix, in order, before the request
        touches them). Default: nothing.

        For a policy that learns from the traffic (``adaptive``, ``branch``, ``density``,
        ``leader``); it must not add or remove resident blocks. It may reorder them
        (``branch`` moves the blocks of a shared prefix to its shared list, changing the
        eviction order).
        """
        del keys  # most policies learn only from add and touch

    @abstractmethod
    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        """Pick ``n`` distinct evictable blocks, or return ``None`` if there are fewer.

        Args:
            n: how many blocks to free (> 0).
            is_held: True for a resident block that must not be evicted now (from
                the manager, a ``HeldBlocks``; tests may pass any function).
            protected: keys that must not be evicted by this call (the store's own).
            incoming: the keys about to be added (a policy may adapt to them).
        """

    @abstractmethod
    def evict(self, victims: Sequence[BlockHash]) -> None:
        """Commit the eviction of blocks returned by ``choose_victims``."""

    def __len__(self) -> int:  # pragma: no cover - each policy overrides
        raise NotImplementedError

    def __contains__(self, key: object) -> bool:  # pragma: no cover - overridden
        """Whether ``key`` is one of the policy's blocks (``lru``, ``arc``, ``slru``
        and ``adaptive`` answer it: the leader's sampled tier asks its policy)."""
        raise NotImplementedError

    def keys(self) -> Iterator[BlockHash]:  # pragma: no cover - overridden likewise
        """The policy's blocks, each once, in no particular order."""
        raise NotImplementedError
