"""``TierManager``: the one ``OffloadingManager`` implementation for a block tier.

Runs in the scheduler; pure Python. It owns everything about the blocks of one tier
-- their states, load pins, slots, capacity, admission, events and stats -- and asks an
``EvictionPolicy`` strategy only which blocks to evict. Each block moves through::

              prepare_store            complete_store(ok)
    absent ─────────────────► STORING ──────────────────► READY ◄──┐
       ▲                         │ complete_store(fail)      │      │ complete_load
       └─────────────────────────┘            prepare_load  ▼      │ (pins - 1)
       ▲                                           READY, pins > 0 ─┘
       └──────── evict (only READY with no pins) ────────┘

Every transition is checked on every call (cheap dict look-ups); a call that would
break the protocol raises ``ProtocolError`` before changing anything.

Eviction is all or nothing, never takes a block among the store's own keys, and costs
time proportional to the blocks evicted (see ``policies.recency``).

The state is plain structures::

    _slots:      dict key -> slot      every resident block (STORING or READY)
    _storing:    set of keys           the STORING ones (few: stores in flight); READY = the rest
    _pinned:     set of keys           the READY blocks pinned by loads (one pin or more)
    _more_pins:  Counter key -> pins   pins past the first (a block two loads pin at once)

A block's pins are ``(key in _pinned) + _more_pins[key]``. The pinned blocks are a set,
with the rare further pins apart, so that a load of blocks pinned once each -- the
usual case -- pins and unpins with set operations, not a loop over its keys.

What eviction must not take is a STORING block or a pinned one (never both: a STORING
block cannot be loaded), asked through ``HeldBlocks`` over the two sets.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import fields
from itertools import filterfalse, takewhile

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.errors import ConfigError, ProtocolError
from kvtier.load_store_specs import SPEC_BY_MEDIUM, BlockIdsSpec
from kvtier.scheduler.policies import EvictionPolicy, make_policy
from kvtier.scheduler.policies.base import HeldBlocks
from kvtier.scheduler.protocol import ManagerStats, OffloadingEvent, PrepareStoreOutput
from kvtier.scheduler.slots import FreeSlots


class BlockState(enum.Enum):
    """State of a resident block (absent blocks have no entry)."""

    STORING = "storing"
    READY = "ready"


class TierManager:
    """Block bookkeeping of one tier of ``num_blocks`` slots.

    Args:
        medium: the medium whose slots this manager hands out.
        num_blocks: capacity, in offloaded blocks (> 0).
        block_size: tokens per offloaded block (> 0); reported in events.
        policy: the eviction strategy (built for ``num_blocks``).
        enable_events: record stored/removed events for ``take_events``.
        store_threshold: reuse-gated admission. ``0`` or ``1`` stores every block;
            ``N >= 2`` stores a block only once ``lookup`` has been asked about it
            ``N`` times (so blocks seen once never displace anything).
    """

    def __init__(
        self,
        *,
        medium: Medium,
        num_blocks: int,
        block_size: int,
        policy: EvictionPolicy,
        enable_events: bool = False,
        store_threshold: int = 0,
    ) -> None:
        _check_positive("num_blocks", num_blocks)
        _check_positive("block_size", block_size)
        if (
            isinstance(store_threshold, bool)
            or not isinstance(store_threshold, int)
            or (store_threshold < 0)
        ):
            raise ConfigError(
                "store_threshold", f"must be an integer >= 0, got {store_threshold!r}"
            )
        self.medium = medium
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.policy = policy
        self.enable_events = enable_events
        self.store_threshold = store_threshold
        self._spec_type: type[BlockIdsSpec] = SPEC_BY_MEDIUM[medium]
        self._slots: dict[BlockHash, BlockId] = {}  # every resident block (module docstring)
        self._storing: set[BlockHash] = set()
        self._pinned: set[BlockHash] = set()  # READY blocks pinned by loads
        self._more_pins: Counter[BlockHash] = Counter()  # their pins past the first
        # Blocks STORING or pinned by a load: not evictable now (module docstring).
        self._is_held = HeldBlocks(self._storing, self._pinned)
        self._free = FreeSlots(num_blocks)  # memory grows with what the tier holds
        self._events: list[OffloadingEvent] = []
        self._seen: OrderedDict[BlockHash, int] = OrderedDict()  # admission counts
        self._seen_cap = 4 * num_blocks
        self._n: dict[str, int] = {f.name: 0 for f in fields(ManagerStats)}

    # -- queries -------------------------------------------------------------------

    def __len__(self) -> int:
        """Resident blocks (STORING or READY)."""
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    def keys(self) -> list[BlockHash]:
        """The resident keys (STORING or READY)."""
        return list(self._slots)

    def state(self, key: BlockHash) -> BlockState | None:
        """The block's state, or ``None`` when it is not resident."""
        if key not in self._slots:
            return None
        return BlockState.STORING if key in self._storing else BlockState.READY

    def pins(self, key: BlockHash) -> int:
        """How many loads currently pin the block (0 when absent)."""
        return (key in self._pinned) + self._more_pins[key]

    def slot(self, key: BlockHash) -> BlockId | None:
        """The block's slot, or ``None`` when it is not resident."""
        return self._slots.get(key)

    @property
    def num_free(self) -> int:
        """Slots not holding any block."""
        return len(self._free)

    def stats(self) -> ManagerStats:
        """A frozen snapshot of the counters."""
        return ManagerStats(**self._n)

    # -- the protocol --------------------------------------------------------------

    def lookup(self, block_hashes: Sequence[BlockHash], start: int = 0) -> int:
        """Length of the longest run of READY blocks from key ``start`` (the first).

        ``block_hashes`` is the request's whole prefix: the policy observes all of it.
        An engine whose own cache serves the first ``start`` blocks passes the whole
        prefix with ``start`` past them (a policy that learns from requests must see
        the request, not its rest); only the keys from ``start`` are counted.
        """
        keys = block_hashes[start:] if start else block_hashes
        hit = len(list(takewhile(self._slots.__contains__, keys)))
        storing = self._storing
        if storing and not storing.isdisjoint(keys[:hit]):  # a block in flight
            hit = next(i for i, key in enumerate(keys) if key in storing)
        self.policy.observe(block_hashes)
        n = self._n
        n["lookups"] += 1
        n["lookup_blocks"] += len(keys)
        n["hit_blocks"] += hit
        if self.store_threshold > 1:
            self._count_seen(keys[hit:])
        return hit

    def prepare_load(self, block_hashes: Sequence[BlockHash]) -> BlockIdsSpec:
        """Pin READY blocks and return their slots, in key order.

        Raises:
            ProtocolError: a key is absent or still being stored (nothing is pinned).
        """
        slots, storing = self._slots, self._storing
        if not all(map(slots.__contains__, block_hashes)) or (
            storing and not storing.isdisjoint(block_hashes)
        ):
            key = next(k for k in block_hashes if k not in slots or k in storing)
            raise ProtocolError(
                f"prepare_load: block {key.hex()[:16]} is "
                f"{'storing' if key in slots else 'absent'}, not ready"
            )
        block_ids = [slots[key] for key in block_hashes]
        pinned = self._pinned
        if pinned.isdisjoint(block_hashes) and len(set(block_hashes)) == len(block_hashes):
            pinned.update(block_hashes)  # the usual case: first pins, each key once
        else:
            for key in block_hashes:
                if key in pinned:
                    self._more_pins[key] += 1
                else:
                    pinned.add(key)
        self._n["loads"] += len(block_hashes)
        return self._spec_type.for_blocks(block_hashes, block_ids)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Mark resident blocks used; the first key ends up the most recent of all.

        Touching a block that is still being stored is recency only (not a reuse).
        Keys that are not resident are ignored.
        """
        resident = list(filter(self._slots.__contains__, reversed(block_hashes)))
        if resident:
            self.policy.touch_all(resident, self._storing)

    def complete_load(self, block_hashes: Sequence[BlockHash]) -> None:
        """Unpin blocks pinned by ``prepare_load``.

        Raises:
            ProtocolError: a key is absent or not pinned (nothing is unpinned).
        """
        pinned, more = self._pinned, self._more_pins
        if (
            not more
            and pinned.issuperset(block_hashes)
            and len(set(block_hashes)) == len(block_hashes)
        ):  # the usual case: one pin each, each key once
            pinned.difference_update(block_hashes)
            self.policy.release_all(block_hashes)
            return
        need = Counter(block_hashes)
        for key, count in need.items():
            if self.pins(key) < count:
                raise ProtocolError(
                    f"complete_load: block {key.hex()[:16]} is not pinned by a load"
                )
        released = []
        for key, count in need.items():
            if more[key] >= count:
                more[key] -= count
                if not more[key]:
                    more.pop(key)
            else:  # its last pin: count is its pins
                more.pop(key, None)
                pinned.remove(key)
                released.append(key)
        self.policy.release_all(released)

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> PrepareStoreOutput | None:
        """Choose the keys to store, evict to make room, and return their slots.

        Resident keys are skipped; with ``store_threshold``, keys not yet looked up
        often enough are skipped too. Room is made by evicting READY, unpinned blocks
        that are not among ``block_hashes``. Returns ``None``, with nothing changed,
        when that is not enough.
        """
        slots = self._slots
        to_store = list(filterfalse(slots.__contains__, block_hashes))
        unique = set(block_hashes)  # half the work of an ordered dict.fromkeys
        if len(unique) != len(block_hashes):  # a key listed twice: stored once, in order
            to_store = list(dict.fromkeys(to_store))
        # Only resident keys of the store can be victims; usually there are none.
        all_new = len(to_store) == len(unique)
        if self.store_threshold > 1:
            admitted = [k for k in to_store if self._seen.get(k, 0) >= self.store_threshold]
            self._n["stores_skipped"] += len(to_store) - len(admitted)
            to_store = admitted
        evicted: list[BlockHash] = []
        need = len(to_store) - len(self._free)
        if need > 0:
            victims = None
            if len(to_store) <= self.num_blocks:
                protected = () if all_new else unique
                victims = self.policy.choose_victims(need, self._is_held, protected, to_store)
            if victims is None:
                self._n["stores_rejected"] += len(to_store)
                return None
            self._evict(victims)
            evicted = victims
        new_slots = self._free.take(len(to_store))
        slots.update(zip(to_store, new_slots, strict=True))
        self._storing.update(to_store)
        self.policy.add_all(to_store)
        if self.store_threshold > 1:
            for key in to_store:
                self._seen.pop(key, None)
        self._n["stores"] += len(to_store)
        return PrepareStoreOutput(
            block_hashes_to_store=tuple(to_store),
            store_spec=self._spec_type.for_blocks(to_store, new_slots),
            block_hashes_evicted=tuple(evicted),
        )

    def can_store(self, block_hashes: Sequence[BlockHash], *, whole: bool = False) -> int:
        """How many leading keys ``prepare_store`` would take now: ask, then act.

        For the answer ``n``, ``prepare_store(block_hashes[:n])`` makes room and returns
        a result, and it would return ``None`` for any longer head. Nothing changes.
        Keys admission (``store_threshold``) would skip do not count against room;
        with ``whole``, the first of them ends the head instead (so that every new key
        of the head is stored: a promotion needs them all).
        """
        slots, storing = self._slots, self._storing
        threshold = self.store_threshold
        pinned = self._pinned
        room = len(self._free) + len(slots) - len(storing) - len(pinned)  # + evictable
        new: set[BlockHash] = set()
        protected: set[BlockHash] = set()
        for i, key in enumerate(block_hashes):
            if key in slots:
                if key not in storing and key not in pinned and key not in protected:
                    protected.add(key)  # READY, unpinned: the store's own, never evicted
                    room -= 1
            elif key not in new:
                if threshold > 1 and self._seen.get(key, 0) < threshold:
                    if whole:
                        return i
                    continue
                new.add(key)
            if len(new) > min(room, self.num_blocks):
                return i
        return len(block_hashes)

    def complete_store(self, block_hashes: Sequence[BlockHash], success: bool = True) -> None:
        """Make STORING blocks READY, or drop them when ``success`` is False.

        Keys already READY are left as they are (a failed store never drops a block
        that became ready).

        Raises:
            ProtocolError: a key is not resident (nothing is changed).
        """
        slots, storing = self._slots, self._storing
        # The STORING keys (READY ones are left as they are); when that is every key,
        # every key is resident (STORING ones are), else each is checked.
        changed = list(filter(storing.__contains__, block_hashes))
        if len(changed) != len(block_hashes) and not all(map(slots.__contains__, block_hashes)):
            key = next(filterfalse(slots.__contains__, block_hashes))
            raise ProtocolError(
                f"complete_store: block {key.hex()[:16]} was not prepared for storing"
            )
        before = len(storing)
        storing.difference_update(changed)
        if success:
            if before - len(storing) != len(changed):  # a key listed twice
                changed = list(dict.fromkeys(changed))
            self.policy.release_all(changed)
            self._n["stored"] += len(changed)
        else:
            changed = list(dict.fromkeys(changed))
            for key in changed:
                self._free.append(slots.pop(key))
                self.policy.remove(key)
            self._n["store_failures"] += len(changed)
        if success and changed and self.enable_events:
            self._events.append(
                OffloadingEvent(tuple(changed), self.block_size, self.medium, removed=False)
            )

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored/removed events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    @property
    def has_pending_work(self) -> bool:
        """A tier alone does no background work."""
        return False

    def shutdown(self) -> None:
        """Nothing to stop (see ``TieredManager.shutdown``)."""

    def restore(self, block_hashes: Sequence[BlockHash]) -> list[BlockId]:
        """Adopt blocks a persistent medium already holds, coldest first, as READY.

        For a tier rebuilt at start-up from what its medium recovered: the i-th key
        gets slot ``i`` of an empty tier. No events are recorded (nothing moved).

        Raises:
            ProtocolError: the tier is not empty, or there are more keys than slots.
        """
        if self._slots or len(block_hashes) > self.num_blocks:
            raise ProtocolError(
                f"restore: {len(block_hashes)} blocks into a tier of {self.num_blocks} "
                f"holding {len(self._slots)}"
            )
        slots = []
        for key in dict.fromkeys(block_hashes):
            slot = self._free.pop()
            self._slots[key] = slot
            self.policy.add(key)
            slots.append(slot)
        return slots

    def discard(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Drop READY, unpinned blocks whose bytes turned out bad or gone.

        For a tier whose medium reported a block unreadable (failed verification, file
        missing): keeping it would make every later lookup count a block that cannot be
        loaded. Absent, pinned or STORING keys are left as they are. Returns the keys
        dropped (recorded as removed events).
        """
        slots, storing, pinned = self._slots, self._storing, self._pinned
        gone = [
            k
            for k in dict.fromkeys(block_hashes)
            if k in slots and k not in storing and k not in pinned
        ]
        for key in gone:
            self._free.append(slots.pop(key))
            self.policy.remove(key)
        if gone and self.enable_events:
            self._events.append(
                OffloadingEvent(tuple(gone), self.block_size, self.medium, removed=True)
            )
        return gone

    def adopt(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Record blocks the medium holds without this process having stored them.

        For a shared tier: another engine wrote them. They become READY here (evicting
        index entries as a store would) and are counted as stored. Returns the keys
        adopted: none when no room can be made.
        """
        out = self.prepare_store(block_hashes)
        if out is None:
            return []
        self.complete_store(out.block_hashes_to_store)
        return list(out.block_hashes_to_store)

    def count_seen(self, block_hashes: Sequence[BlockHash]) -> None:
        """Count a use of blocks for reuse-gated admission without a ``lookup``.

        An engine calls it for blocks its own GPU prefix cache served: they were
        reused, so with ``store_threshold`` they move closer to being stored.
        """
        if self.store_threshold > 1:
            self._count_seen(block_hashes)

    # -- internals ------------------------------------------------------------------

    def _evict(self, victims: list[BlockHash]) -> None:
        if self._is_held.any_of(victims):
            raise AssertionError("policy chose a held block")
        slots = self._slots
        self._free.extend(map(slots.pop, victims))
        self.policy.evict(victims)
        self._n["evictions"] += len(victims)
        if self.enable_events:
            self._events.append(
                OffloadingEvent(tuple(victims), self.block_size, self.medium, removed=True)
            )

    def _count_seen(self, keys: Sequence[BlockHash]) -> None:
        seen = self._seen
        for key in keys:
            if key in self._slots:
                continue
            seen[key] = seen.pop(key, 0) + 1
        while len(seen) > self._seen_cap:
            seen.popitem(last=False)


class CPUOffloadingManager(TierManager):
    """The CPU tier's manager: slots of the pinned host slab.

    Example::

        m = CPUOffloadingManager(num_blocks=1024, block_size=16, eviction_policy="arc")
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        eviction_policy: str = "lru",
        enable_events: bool = False,
        store_threshold: int = 0,
    ) -> None:
        _check_positive("num_blocks", num_blocks)
        super().__init__(
            medium=Medium.CPU,
            num_blocks=num_blocks,
            block_size=block_size,
            policy=make_policy(eviction_policy, num_blocks),
            enable_events=enable_events,
            store_threshold=store_threshold,
        )


def _check_positive(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
