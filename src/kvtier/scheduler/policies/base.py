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
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence, Set
from typing import TypeVar

from kvtier.blocks import BlockHash

IsHeld = Callable[[BlockHash], bool]
K = TypeVar("K", bound=Hashable)


class HeldBlocks:
    """The manager's ``is_held``: a block being stored, or pinned by a load.

    Reads the manager's sets of STORING blocks and of pinned ones, which the manager
    changes in place. Called with a key it answers for one block; ``any_of`` answers
    for a batch (``any_held`` asks it when it can).
    """

    __slots__ = ("_pinned", "_storing")

    def __init__(self, storing: Set[BlockHash], pinned: Set[BlockHash]) -> None:
        self._storing = storing
        self._pinned = pinned

    @property
    def n_pinned(self) -> int:
        """How many blocks are pinned (each counted once, whatever its pins)."""
        return len(self._pinned)

    def __call__(self, key: object) -> bool:
        return key in self._storing or key in self._pinned

    def any_of(self, keys: Sequence[object]) -> bool:
        """Whether some of ``keys`` is held. An empty set or counter is not asked:
        ``isdisjoint`` hashes and looks up every key even then, and with no store in
        flight and no load pending (the usual case) both are empty."""
        storing, pinned = self._storing, self._pinned
        return bool(
            (storing and not storing.isdisjoint(keys)) or (pinned and not pinned.isdisjoint(keys))
        )


def any_held(is_held: Callable[[K], bool], keys: Sequence[K]) -> bool:
    """Whether ``is_held`` is true of some of ``keys``: one set test per structure
    for the manager's ``HeldBlocks``, a call per key for any other function."""
    if type(is_held) is HeldBlocks:
        return is_held.any_of(keys)
    return any(map(is_held, keys))


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
