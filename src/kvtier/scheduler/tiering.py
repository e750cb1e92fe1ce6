"""``TieredManager``: the CPU tier in front of secondary tiers (disk, remote).

Runs in the scheduler; pure Python. An inclusive, write-through hierarchy:

* Engines store into and load from the **primary** (CPU) tier only.
* When a block becomes READY in the primary, it is queued for writing to each
  **secondary** tier in the background. The queue is bounded: when it is full, the
  write is skipped and counted (``writes_skipped``) -- the engine is never blocked.
* ``lookup`` covers every tier: a run of blocks each READY in *some* tier. A *shared*
  tier (remote) may hold blocks that other engines wrote: for keys no tier knows,
  ``lookup`` asks it in the background (``Discovery``: one batched existence check on
  its own thread) and a later ``lookup`` adopts what it found into that tier's index;
  ``lookup`` itself never waits on the network. A failing check is no hit, never an
  error. After an outage of a shared store (it may have restarted empty) its index is
  forgotten and rebuilt by later checks.
* A block found only in a secondary tier is **promoted**: a CPU slot is prepared
  (STORING), the block is pinned in the secondary, a secondary→CPU job copies it, and
  ``complete_promotion`` makes it READY in CPU. Then it loads to the GPU as usual.
* Each tier evicts by its own policy; events carry each tier's medium.

The connector's scheduler half drives the background work: ``prepare_writes`` hands
out write jobs, ``complete_write`` closes them. Jobs are values (``TierJob``) with both
specs; a write job's destination spec also names the keys the secondary tier dropped
(``evicted_hashes``), so the worker deletes them with no index of its own.

A tiering with no secondary tier is just its primary: engines use this one type
whatever is configured, and ask it (``can_store``, ``can_promote``) before they act.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvtier.blocks import BlockHash, Medium
from kvtier.errors import ConfigError, ProtocolError
from kvtier.load_store_specs import BlockIdsSpec, KeyedBlocksSpec, LoadStoreSpec
from kvtier.scheduler.discovery import Discovery, SharedStore
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.protocol import OffloadingEvent, PrepareStoreOutput

__all__ = ["SharedStore", "TierJob", "TieredManager", "TieringStats"]


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
        self._discovery = {medium: Discovery(store) for medium, store in self._shared.items()}
        self._deletes: dict[Medium, list[BlockHash]] = {t.medium: [] for t in self.secondaries}
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

    def lookup(self, block_hashes: Sequence[BlockHash], start: int = 0) -> int:
        """Length of the run of blocks, from key ``start`` (the first), READY in some
        tier; every tier's policy observes the whole prefix (``TierManager.lookup``)."""
        self._forget_after_outages()
        self._adopt_discoveries()
        n = self.primary.lookup(block_hashes, start)
        for tier in self.secondaries:  # a policy that learns from lookups sees them all
            tier.policy.observe(block_hashes)
        self._hits[self.primary.medium] += n
        keys = block_hashes[start:] if start else block_hashes
        n += self._known_run(keys[n:])
        if n < len(keys):
            for discovery in self._discovery.values():
                discovery.ask(keys[n:])  # answered on a later lookup
        return n

    def lookup_known(self, block_hashes: Sequence[BlockHash]) -> int:
        """``lookup`` again for keys just looked up: adopts finished discoveries, asks
        nothing new and counts nothing (a caller that waited for a discovery)."""
        self._forget_after_outages()
        self._adopt_discoveries()
        run = 0
        for key in block_hashes:
            if self.holder(key) is None:
                break
            run += 1
        return run

    def discovering(self, block_hashes: Sequence[BlockHash]) -> bool:
        """Whether a shared tier is still being asked about the run of these keys."""
        return bool(block_hashes) and any(
            d.asking(block_hashes[0]) for d in self._discovery.values()
        )

    def _known_run(self, keys: Sequence[BlockHash]) -> int:
        run = 0
        for key in keys:
            tier = self.holder(key)
            if tier is None:
                break
            self._hits[tier.medium] += 1
            run += 1
        return run

    def _adopt_discoveries(self) -> None:
        """Adopt what finished background checks found (unless an outage came since)."""
        for tier in self.secondaries:
            discovery = self._discovery.get(tier.medium)
            if discovery is None:
                continue
            for found in discovery.answers():
                if found.outages == self._outages[tier.medium]:
                    tier.adopt(found.keys)

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
        return self.primary.prepare_store(self._not_in_secondaries(block_hashes))

    def can_store(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading keys ``prepare_store`` would take now: ask, then act.

        ``prepare_store(block_hashes[:n])`` returns a result for the answer ``n`` and
        ``None`` for any longer head. Nothing changes.
        """
        if not self.secondaries:
            return self.primary.can_store(block_hashes)
        keys = self._not_in_secondaries(block_hashes)
        n = self.primary.can_store(keys)
        return len(block_hashes) if n == len(keys) else list(block_hashes).index(keys[n])

    def count_seen(self, block_hashes: Sequence[BlockHash]) -> None:
        """Count a use of blocks the engine's own GPU cache served (reuse admission)."""
        self.primary.count_seen(block_hashes)

    def ready_run(self, block_hashes: Sequence[BlockHash]) -> int:
        """Length of the run of keys, from the first, READY in the primary (no side
        effects: what a load may pin now)."""
        run = 0
        for key in block_hashes:
            if self.primary.state(key) is not BlockState.READY:
                break
            run += 1
        return run

    def _not_in_secondaries(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        secondaries = self.secondaries
        return [
            k for k in block_hashes if not any(t.state(k) is BlockState.READY for t in secondaries)
        ]

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
        if self.primary.can_store(wanted, whole=True) < len(wanted):
            return None  # no room, or admission would skip a key: ask before acting
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

    def can_promote(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading keys ``prepare_promotion`` would take now: ask, then act.

        ``prepare_promotion(block_hashes[:n])`` returns jobs for the answer ``n`` and
        ``None`` for any longer head. Nothing changes.
        """
        wanted: list[BlockHash] = []
        where: list[int] = []  # where[i]: the index of wanted[i] in block_hashes
        end = len(block_hashes)
        for i, key in enumerate(block_hashes):
            state = self.primary.state(key)
            if state is BlockState.READY:
                continue
            if state is not None or not any(
                t.state(key) is BlockState.READY for t in self.secondaries
            ):
                end = i  # being stored into the primary, or in no tier
                break
            wanted.append(key)
            where.append(i)
        n = self.primary.can_store(wanted, whole=True)
        return end if n == len(wanted) else where[n]

    def complete_promotion(self, job: TierJob, success: bool) -> None:
        """Close a promotion job: the blocks are READY in the primary, or dropped there
        and from the secondary tier that could not deliver them."""
        tier = self._tier(job.src)
        tier.complete_load(job.block_hashes)
        self.primary.complete_store(job.block_hashes, success)
        if not success:  # unreadable there (bad checksum, file gone): a miss from now on
            self._deletes[tier.medium].extend(tier.discard(job.block_hashes))
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
                jobs.append(TierJob(tuple(todo), src, self._with_deletes(tier, out)))
        return jobs

    def _with_deletes(self, tier: TierManager, out: PrepareStoreOutput) -> LoadStoreSpec:
        """The write's destination, naming what the worker must delete first: the keys
        evicted for it, and keys dropped since (unless stored again meanwhile)."""
        dst = out.store_spec
        dropped, self._deletes[tier.medium] = self._deletes[tier.medium], []
        if tier.medium in self._shared or not isinstance(dst, KeyedBlocksSpec):
            return dst  # a shared store is not ours to delete from: its own LRU does
        evicted = (*out.block_hashes_evicted, *dropped)
        deletes = [k for k in dict.fromkeys(evicted) if k not in tier]
        if not deletes:
            return dst
        return dataclasses.replace(dst, evicted_hashes=tuple(deletes))

    def complete_write(self, job: TierJob, success: bool) -> None:
        """Close a write-through job: unpin in the primary, complete in the secondary."""
        self.primary.complete_load(job.block_hashes)
        self._tier(job.dst).complete_store(job.block_hashes, success)
        self._n["writes" if success else "write_failures"] += len(job.block_hashes)

    @property
    def pending_writes(self) -> int:
        """Blocks waiting in the write-through queues."""
        return sum(len(q) for q in self._queues.values())

    @property
    def has_pending_work(self) -> bool:
        """Whether background work remains: queued writes or running discoveries."""
        return bool(self.pending_writes) or any(d.in_flight for d in self._discovery.values())

    def wait_discoveries(self, timeout_s: float | None = None) -> None:
        """Block until the background existence checks in flight have finished (their
        answers are adopted by the next ``lookup``)."""
        for discovery in self._discovery.values():
            discovery.wait(timeout_s)

    def shutdown(self) -> None:
        """Stop the background checks (a running one ends within the store's timeout)."""
        for discovery in self._discovery.values():
            discovery.shutdown()

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
