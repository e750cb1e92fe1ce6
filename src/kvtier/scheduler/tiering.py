"""``TieredManager``: the CPU tier in front of secondary tiers (disk, remote).

Runs in the scheduler; pure Python. An inclusive, write-through hierarchy:

* Engines store into and load from the **primary** (CPU) tier only.
* When a block becomes READY in the primary, it is queued for writing to each
  **secondary** tier in the background. The queue is bounded: when it is full, the
  write is skipped and counted (``writes_skipped``) -- the engine is never blocked.
* ``lookup`` covers every tier: a run of blocks each READY in *some* tier. A *shared*
  tier (remote) may hold blocks that other engines wrote: for keys no tier knows,
  ``lookup`` asks it (``discover``, one batched existence check) and adopts what it
  finds into that tier's index. A failing check is no hit, never an error. After an
  outage of a shared store (it may have restarted empty) its index is forgotten and
  rebuilt by later checks.
* A block found only in a secondary tier is **promoted**: a CPU slot is prepared
  (STORING), the block is pinned in the secondary, a secondary→CPU job copies it, and
  ``complete_promotion`` makes it READY in CPU. Then it loads to the GPU as usual.
* Each tier evicts by its own policy; events carry each tier's medium.

The connector drives the background work: ``prepare_writes`` hands out write jobs,
``complete_write`` closes them. Jobs are values (``TierJob``) with both specs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvtier.blocks import BlockHash, Medium
from kvtier.errors import ConfigError, KvtierError, ProtocolError
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.protocol import OffloadingEvent, PrepareStoreOutput
from kvtier.specs import BlockIdsSpec, LoadStoreSpec


class SharedStore(Protocol):
    """What the tiering asks of a store that other engines write to (remote)."""

    def exists_many(self, keys: Sequence[bytes]) -> Sequence[bool]:
        """Which keys the store holds (one batched check; may raise ``KvtierError``)."""
        ...

    @property
    def outages(self) -> int:
        """How many outages the store has had: after one, its contents may be gone."""
        ...


@dataclass(frozen=True, slots=True)
class TierJob:
    """A copy between two tiers that the connector submits to the worker.

    Attributes:
        block_hashes: the blocks moved, in spec order.
        src: where they are read.
        dst: where they are written.
    """

    block_hashes: tuple[BlockHash, ...]
    src: LoadStoreSpec
    dst: LoadStoreSpec


@dataclass(frozen=True, slots=True)
class TieringStats:
    """Counters of the tiering layer (each tier keeps its own ``ManagerStats``).

    Attributes:
        hit_blocks: blocks reported by ``lookup``, per medium that holds them (the
            primary first: a block in both counts for the primary).
        promotions: blocks promoted from a secondary tier into the primary.
        promotion_failures: promoted blocks whose copy failed.
        writes: blocks written to secondary tiers.
        write_failures: blocks whose secondary write failed.
        writes_skipped: blocks not written because the queue was full or the
            secondary tier could not make room.
    """

    hit_blocks: dict[Medium, int]
    promotions: int
    promotion_failures: int
    writes: int
    write_failures: int
    writes_skipped: int


class TieredManager:
    """A primary ``TierManager`` composed with secondary ones. See the module doc.

    Args:
        primary: the tier engines load from and store into (CPU).
        secondaries: tiers behind it, searched in this order.
        max_pending_writes: bound of the write-through queue, in blocks per tier.
        shared: the stores of shared tiers, by medium (see ``SharedStore``).
    """

    def __init__(
        self,
        primary: TierManager,
        secondaries: Sequence[TierManager],
        max_pending_writes: int = 1024,
        shared: Mapping[Medium, SharedStore] | None = None,
    ) -> None:
        if max_pending_writes < 1:
            raise ConfigError("max_pending_writes", f"must be >= 1, got {max_pending_writes}")
        self.primary = primary
        self.secondaries = tuple(secondaries)
        self.block_size = primary.block_size
        self.max_pending_writes = max_pending_writes
        self._shared = dict(shared or {})
        self._outages = {medium: store.outages for medium, store in self._shared.items()}
        self._queues: dict[Medium, OrderedDict[BlockHash, None]] = {
            t.medium: OrderedDict() for t in self.secondaries
        }
        self._hits: dict[Medium, int] = {t.medium: 0 for t in (primary, *self.secondaries)}
        self._n = {
            "promotions": 0,
            "promotion_failures": 0,
            "writes": 0,
            "write_failures": 0,
            "writes_skipped": 0,
        }

    # -- the OffloadingManager protocol (primary-facing) ------------------------------

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        """Length of the run of blocks, from the first, READY in some tier."""
        self._forget_after_outages()
        n = self.primary.lookup(block_hashes)
        self._hits[self.primary.medium] += n
        n += self._known_run(block_hashes[n:])
        if n < len(block_hashes) and self._shared:
            self._discover_run(block_hashes[n:])
            n += self._known_run(block_hashes[n:])
        return n

    def _known_run(self, keys: Sequence[BlockHash]) -> int:
        run = 0
        for key in keys:
            tier = self.holder(key)
            if tier is None:
                break
            self._hits[tier.medium] += 1
            run += 1
        return run

    def _discover_run(self, keys: Sequence[BlockHash]) -> None:
        """Adopt the leading keys that a shared tier holds (one existence check each)."""
        for tier in self.secondaries:
            store = self._shared.get(tier.medium)
            if store is None:
                continue
            try:
                found = store.exists_many(keys)
            except KvtierError:
                continue  # unreachable or unhealthy: no hits from it now
            run = next((i for i, hit in enumerate(found) if not hit), len(found))
            if run:
                tier.adopt(keys[:run])
                return

    def _forget_after_outages(self) -> None:
        for tier in self.secondaries:
            store = self._shared.get(tier.medium)
            if store is not None and store.outages != self._outages[tier.medium]:
                self._outages[tier.medium] = store.outages
                tier.discard(tier.keys())  # pinned blocks stay; their jobs will tell

    def holder(self, key: BlockHash) -> TierManager | None:
        """The first tier, primary first, where ``key`` is READY."""
        for tier in (self.primary, *self.secondaries):
            if tier.state(key) is BlockState.READY:
                return tier
        return None

    def prepare_load(self, block_hashes: Sequence[BlockHash]) -> LoadStoreSpec:
        """Pin blocks READY in the primary (promote the others first)."""
        return self.primary.prepare_load(block_hashes)

    def complete_load(self, block_hashes: Sequence[BlockHash]) -> None:
        self.primary.complete_load(block_hashes)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        for tier in (self.primary, *self.secondaries):
            tier.touch(block_hashes)

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> PrepareStoreOutput | None:
        """Store into the primary the keys no tier holds yet.

        A key READY in a secondary tier is left out: it is promoted when it is needed,
        so copying it out of the GPU again would only cost bandwidth and CPU room.
        """
        secondaries = self.secondaries
        keys = [
            k for k in block_hashes if not any(t.state(k) is BlockState.READY for t in secondaries)
        ]
        return self.primary.prepare_store(keys)

    def complete_store(self, block_hashes: Sequence[BlockHash], success: bool = True) -> None:
        """Complete a store into the primary and queue the new blocks for write-through."""
        newly_ready = [k for k in block_hashes if self.primary.state(k) is BlockState.STORING]
        self.primary.complete_store(block_hashes, success)
        if success:
            self._enqueue(newly_ready)

    def take_events(self) -> Iterable[OffloadingEvent]:
        events = list(self.primary.take_events())
        for tier in self.secondaries:
            events.extend(tier.take_events())
        return events

    # -- promotion: secondary -> primary ------------------------------------------------

    def prepare_promotion(self, block_hashes: Sequence[BlockHash]) -> list[TierJob] | None:
        """Prepare copies of blocks READY only in secondary tiers into the primary.

        Keys already READY in the primary are left out. Returns one job per secondary
        tier involved (possibly none), or ``None`` -- with nothing changed -- when the
        primary cannot make room or a key is in no tier.
        """
        plan: dict[Medium, list[BlockHash]] = {}
        for key in block_hashes:
            if self.primary.state(key) is BlockState.READY:
                continue
            tier = next((t for t in self.secondaries if t.state(key) is BlockState.READY), None)
            if tier is None or self.primary.state(key) is not None:
                return None  # in no tier, or already being stored into the primary
            plan.setdefault(tier.medium, []).append(key)
        wanted = [k for keys in plan.values() for k in keys]
        if not wanted:
            return []
        out = self.primary.prepare_store(wanted)
        if out is None or len(out.block_hashes_to_store) != len(wanted):
            if out is not None:
                self.primary.complete_store(out.block_hashes_to_store, success=False)
            return None
        assert isinstance(out.store_spec, BlockIdsSpec)
        slot_of = dict(zip(out.block_hashes_to_store, out.store_spec.block_ids, strict=True))
        jobs = []
        for tier in self.secondaries:
            keys = plan.get(tier.medium)
            if keys:
                src = tier.prepare_load(keys)
                dst = type(out.store_spec).for_blocks(keys, [slot_of[k] for k in keys])
                jobs.append(TierJob(tuple(keys), src, dst))
        return jobs

    def complete_promotion(self, job: TierJob, success: bool) -> None:
        """Close a promotion job: the blocks are READY in the primary, or dropped there
        and from the secondary tier that could not deliver them."""
        tier = self._tier(job.src)
        tier.complete_load(job.block_hashes)
        self.primary.complete_store(job.block_hashes, success)
        if not success:  # unreadable there (bad checksum, file gone): a miss from now on
            tier.discard(job.block_hashes)
        key = "promotions" if success else "promotion_failures"
        self._n[key] += len(job.block_hashes)

    # -- write-through: primary -> secondaries ---------------------------------------

    def prepare_writes(self, max_blocks: int | None = None) -> list[TierJob]:
        """Hand out queued write-through jobs, at most ``max_blocks`` blocks each tier.

        Each job pins its blocks in the primary and prepares them in the secondary.
        Blocks that left the primary meanwhile are dropped from the queue; blocks the
        secondary cannot make room for are skipped and counted.
        """
        jobs = []
        for tier in self.secondaries:
            queue = self._queues[tier.medium]
            keys: list[BlockHash] = []
            while queue and (max_blocks is None or len(keys) < max_blocks):
                key, _ = queue.popitem(last=False)
                if self.primary.state(key) is BlockState.READY:
                    keys.append(key)
            if not keys:
                continue
            out = tier.prepare_store(keys)
            if out is None:
                self._n["writes_skipped"] += len(keys)
                continue
            todo = list(out.block_hashes_to_store)
            if todo:
                src = self.primary.prepare_load(todo)
                jobs.append(TierJob(tuple(todo), src, out.store_spec))
        return jobs

    def complete_write(self, job: TierJob, success: bool) -> None:
        """Close a write-through job: unpin in the primary, complete in the secondary."""
        self.primary.complete_load(job.block_hashes)
        self._tier(job.dst).complete_store(job.block_hashes, success)
        self._n["writes" if success else "write_failures"] += len(job.block_hashes)

    @property
    def pending_writes(self) -> int:
        """Blocks waiting in the write-through queues."""
        return sum(len(q) for q in self._queues.values())

    def stats(self) -> TieringStats:
        return TieringStats(hit_blocks=dict(self._hits), **self._n)

    # -- internals --------------------------------------------------------------------

    def _enqueue(self, keys: Sequence[BlockHash]) -> None:
        for tier in self.secondaries:
            queue = self._queues[tier.medium]
            for key in keys:
                if key in tier:
                    continue
                if len(queue) >= self.max_pending_writes:
                    self._n["writes_skipped"] += 1
                else:
                    queue[key] = None

    def _tier(self, spec: LoadStoreSpec) -> TierManager:
        for tier in self.secondaries:
            if tier.medium == spec.medium:
                return tier
        raise ProtocolError(f"no secondary tier of medium {spec.medium}")
