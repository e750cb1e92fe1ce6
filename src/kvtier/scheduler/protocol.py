"""The ``OffloadingManager`` protocol and the values it trades in.

Runs in the scheduler process; pure Python. The names and meanings are the seed
documents' (vLLM's ``kv_offload``), so engines that speak that protocol speak this one:

* ``lookup(keys, start=0) -> int``: how many blocks, from key ``start``, are offloaded
  and ready (``keys``: the request's whole prefix; an engine whose GPU cache served
  the first ``start`` passes them too, for the policies that learn from requests).
* ``prepare_load(keys) -> spec``: pin the blocks against eviction; say where they are.
* ``touch(keys)``: mark used (also for blocks the GPU prefix cache served itself).
* ``complete_load(keys)``: unpin.
* ``prepare_store(keys) -> PrepareStoreOutput | None``: choose what to store, evict
  to make room (all or nothing), say where to write; ``None`` if it cannot now.
* ``complete_store(keys, success)``: stored blocks become loadable, or are dropped.
* ``take_events()``: stored/removed events since the last call.
* ``can_store(keys) -> int``: how many leading keys ``prepare_store`` would take now
  (ask, then act).
* ``has_pending_work``: background work not done yet; ``shutdown()`` stops it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvtier.blocks import BlockHash, Medium
from kvtier.load_store_specs import LoadStoreSpec


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """What ``prepare_store`` decided.

    Attributes:
        block_hashes_to_store: the keys to write, in input order (resident keys and
            keys refused by admission are left out).
        store_spec: where to write them, one slot per key, same order.
        block_hashes_evicted: keys evicted to make room (already gone from the tier).
    """

    block_hashes_to_store: tuple[BlockHash, ...]
    store_spec: LoadStoreSpec
    block_hashes_evicted: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """Blocks that became loadable (``removed=False``) or left a tier (``removed=True``)."""

    block_hashes: tuple[BlockHash, ...]
    block_size: int
    medium: Medium
    removed: bool


@dataclass(frozen=True, slots=True)
class ManagerStats:
    """Counters since the manager was built (a snapshot; see ``stats()``).

    Attributes:
        lookups: ``lookup`` calls.
        lookup_blocks: keys passed to ``lookup``.
        hit_blocks: blocks ``lookup`` reported as ready (the returned lengths, summed).
        stores: blocks accepted for storing by ``prepare_store``.
        stored: blocks that became ready through ``complete_store(success=True)``.
        store_failures: blocks dropped by ``complete_store(success=False)``.
        stores_skipped: blocks refused by reuse-gated admission (``store_threshold``).
        stores_rejected: blocks of ``prepare_store`` calls that returned ``None``.
        evictions: blocks evicted to make room.
        loads: blocks pinned by ``prepare_load``.
    """

    lookups: int = 0
    lookup_blocks: int = 0
    hit_blocks: int = 0
    stores: int = 0
    stored: int = 0
    store_failures: int = 0
    stores_skipped: int = 0
    stores_rejected: int = 0
    evictions: int = 0
    loads: int = 0


@runtime_checkable
class OffloadingManager(Protocol):
    """Scheduler-side bookkeeping of one offloading tier (or a tiered composition)."""

    def lookup(self, block_hashes: Sequence[BlockHash], start: int = 0) -> int:
        """Length of the longest run of keys, from key ``start`` (the first), that are
        ready here. ``block_hashes`` is the request's whole prefix, in order: a policy
        that learns from requests observes all of it, before the request's ``touch``."""
        ...

    def prepare_load(self, block_hashes: Sequence[BlockHash]) -> LoadStoreSpec:
        """Pin ready blocks against eviction and return where they are.

        Raises:
            ProtocolError: a key is not ready (nothing is pinned then).
        """
        ...

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Mark blocks used; the first key becomes the most recent of all."""
        ...

    def complete_load(self, block_hashes: Sequence[BlockHash]) -> None:
        """Unpin blocks pinned by ``prepare_load``."""
        ...

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> PrepareStoreOutput | None:
        """Choose which keys to store, evict to make room, and say where to write.

        Returns ``None``, with the tier unchanged, when not enough room can be made.
        """
        ...

    def complete_store(self, block_hashes: Sequence[BlockHash], success: bool = True) -> None:
        """Make stored blocks loadable, or drop those that never became ready."""
        ...

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored/removed events since the last call (empty if events are off)."""
        ...

    def can_store(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading keys ``prepare_store`` would take now; changes nothing."""
        ...

    @property
    def has_pending_work(self) -> bool:
        """Whether background work (write-through, existence checks) is not done yet."""
        ...

    def shutdown(self) -> None:
        """Stop background work (idempotent)."""
        ...
