"""kvtier's ``OffloadingManager`` for vLLM: kvtier's tiers behind vLLM's per-key protocol.

Runs in vLLM's scheduler process (EngineCore), called from the scheduler thread. One
manager serves every rank (a block's key names all its shards). It wraps kvtier's
``TierManager`` for the CPU tier (kvtier's policies, pins, byte accounting) and, with
disk or Redis configured, kvtier's ``TieredManager`` (write-through, promotion).

vLLM's lookup is per key and answers one of four values:

=================  ==============================================================
``HIT``            READY in the CPU tier (counted as a use: vLLM never calls touch)
``HIT_PENDING``    being stored into the CPU tier: from the GPU, or promoted from
                   disk / Redis (vLLM asks again at a later step)
``RETRY``          kvtier is asking Redis whether another engine stored it
``MISS``           in no tier, a promotion / check of it failed, or it was promoted
                   for this request and left the CPU tier before vLLM loaded it
                   (the request's blocks do not fit in the CPU tier at once)
=================  ==============================================================

A block in disk or Redis only is promoted into the CPU tier *before* vLLM hears it hit:
the lookup starts the promotion (``RankMover``, off this thread) and answers
``HIT_PENDING``; when every rank's shard has been read and verified it is READY and the
next lookup answers ``HIT``. A failed promotion (a block failing its checksum, a file
gone, Redis down) drops the block from the CPU tier and from the tier that could not
deliver it, so the next lookup answers ``MISS`` and vLLM recomputes. vLLM's loads
therefore only ever read READY CPU blocks, and no failure reaches its asserts.

Whole requests: vLLM asks about one key at a time, but kvtier's policies learn from
requests (``leader``, ``density``, ``adaptive``). The first lookup of a request's KV
cache group shows the policies the group's whole request -- every key vLLM has for it
in that group, in prefix order, with the blocks its GPU cache served -- as one
``lookup`` and one ``touch``, exactly as ``kvtier simulate`` and the reference engine
do; each store then touches the request again (key 0 ends up the most recent). Later
lookups of the same request are answered from the tiers without asking the policies
again. The request's keys come from vLLM's request context (``RequestKeys``).

KV cache groups. A hybrid model's groups (full attention, sliding window, chunked
local attention, Mamba state) are told apart by the group index at the end of every
key, so one CPU tier holds them all, each group's blocks under its own keys. Which
keys a hit needs is vLLM's connector's decision (a windowed group only the blocks of
its window before the hit end); the manager answers for each key it is asked about.
With Redis, a windowed group's blocks there are asked about all at once
(``windows``): they are sparse, where the tiering's discovery expects a run.

Threads: the manager's state is only touched by the thread that calls it. The mover's
I/O threads never touch it (they report through the mover's queues, polled here). The
``lock`` is a real lock all the same, so a caller on another thread is excluded; vLLM
0.33 holds it for each step, 0.32 never takes it, and neither matters to the I/O.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

from kvtier.blocks import BlockHash, Medium
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.metrics import (
    LOADED_BLOCKS,
    LOOKUPS,
    PROMOTION_FAILURES,
    PROMOTIONS,
    STORE_FAILURES,
    TIER_HITS,
    TIER_NAMES,
    WRITE_FAILURES,
    KvtierCounters,
    failure_reason,
)
from kvtier.integrations.vllm.mover import RankMover
from kvtier.integrations.vllm.region import STORE_FAILED, STORE_OK, HostRegion
from kvtier.integrations.vllm.requests import GROUP_SUFFIX, Request, RequestKeys, group_of
from kvtier.integrations.vllm.windows import WindowChecks
from kvtier.load_store_specs import BlockIdsSpec
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.tiering import TieredManager, TierJob

logger = logging.getLogger(__name__)

_EVENT_SOURCE: dict[Medium, tuple[Any, Any, str | None]] = {
    Medium.CPU: (compat.Medium.CPU, None, None),
    Medium.DISK: (compat.Medium.STORAGE, compat.Locality.LOCAL, "kvtier-disk"),
    Medium.REMOTE: (compat.Medium.STORAGE, compat.Locality.REMOTE, "kvtier-redis"),
}
"""vLLM's (medium, locality, ownership) for each kvtier tier's events."""


def _window_token(req_context: Any, key: BlockHash) -> tuple[str, bytes]:
    """Names one request's windowed group for ``WindowChecks``."""
    return (str(req_context.req_id), bytes(key)[-GROUP_SUFFIX:])


REFUSED_CAP = 65536
"""Keys remembered as failed promotions (oldest forgotten first)."""


class KvtierManager(compat.OffloadingManager):  # type: ignore[misc]
    """The scheduler side of kvtier's vLLM spec. Built by ``KvtierOffloadingSpec``.

    Args:
        cpu: the CPU tier.
        tiered: the CPU tier composed with disk / Redis, or ``None``.
        region: the shared CPU memory (its status bytes report failed stores).
        mover: runs promotions and write-throughs, or ``None`` without slow tiers.
        on_shutdown: closes the stores and the region.
        windows: asks Redis about windowed groups' blocks, or ``None`` without Redis.
    """

    def __init__(
        self,
        cpu: TierManager,
        tiered: TieredManager | None,
        region: HostRegion,
        mover: RankMover | None = None,
        on_shutdown: Any = None,
        windows: WindowChecks | None = None,
        window_blocks: int = 0,
    ) -> None:
        self.cpu = cpu
        # CPU blocks a request's windowed groups need beside its full-attention run
        # (``spec.window_blocks``): the run is promoted only as far as leaves them room.
        self.window_blocks = window_blocks
        self._run_blocks = cpu.num_blocks - window_blocks
        self.tiered = tiered
        self.region = region
        self.mover = mover
        self.windows = windows
        self._on_shutdown = on_shutdown
        self._lock = threading.Lock()
        self._kinds: dict[int, str] = {}  # mover job id -> "promote" | "write"
        self._keys = RequestKeys()
        # Keys whose promotion failed: never promoted again (no retry loop).
        self._refused: OrderedDict[BlockHash, None] = OrderedDict()
        self.metrics = KvtierCounters()

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    # -- lookups ----------------------------------------------------------------------

    def lookup(self, key: Any, req_context: Any) -> Any:
        """One key: HIT, HIT_PENDING, RETRY or MISS (see the module doc)."""
        self._poll()
        k = BlockHash(bytes(key))
        self._admit(k, req_context)
        state = self.cpu.state(k)
        if state is BlockState.READY:
            return self._count("hit", compat.LookupResult.HIT)
        if state is BlockState.STORING:
            return self._count("pending", compat.LookupResult.HIT_PENDING)
        tiered = self.tiered
        if tiered is None or self.mover is None or k in self._refused:
            return self._count("miss", compat.LookupResult.MISS)
        if tiered.holder(k) is None:
            tiered.lookup_known([k])  # adopts what finished existence checks found
        if tiered.holder(k) is None:
            if tiered.discovering([k]) or self._checking_window(k, req_context):
                return self._count("retry", compat.LookupResult.RETRY)  # Redis is asked
            return self._count("miss", compat.LookupResult.MISS)
        request = self._keys.of(req_context, k)
        if k in request.promoted or not self._promotable(request, k, req_context):
            # Promoted and gone again, or past what the CPU tier holds of one request:
            # a promotion now would evict the request's own blocks before vLLM loads
            # them. vLLM loads the run before this key and computes the rest.
            return self._count("miss", compat.LookupResult.MISS)
        jobs = tiered.prepare_promotion([k])
        if not jobs:  # None: no CPU room now; []: cannot happen (not READY in CPU)
            return self._count("miss", compat.LookupResult.MISS)
        request.promoted.add(k)
        for job in jobs:
            self._kinds[self.mover.submit(job)] = "promote"
            self.metrics.add(TIER_HITS, len(job.block_hashes), (TIER_NAMES[job.src.medium],))
        return self._count("pending", compat.LookupResult.HIT_PENDING)

    def _promotable(self, request: Request, key: BlockHash, req_context: Any) -> bool:
        """Whether promoting ``key`` stays within what the CPU tier holds of its request.

        A full-attention group's run, from where vLLM's own cache stopped, gets the
        tier less the windows' room (``window_blocks``). vLLM looks a windowed group
        up from the right of the whole prompt, whatever the full groups found: a
        window past where their run can reach would be promoted for nothing and evict
        the run, so it misses, and vLLM looks further left. A windowed group's own
        lookups go leftwards from its first.
        """
        at = request.index(key)
        if not request.windowed:
            return at - request.first < self._run_blocks
        reach = self._full_reach(req_context)
        if reach is None:  # windowed groups only
            return request.first_looked - at < self.cpu.num_blocks
        end = request.ends[at]
        return end is None or end <= reach

    def _full_reach(self, req_context: Any) -> int | None:
        """The token position up to which the request's full-attention groups can be
        promoted (``None``: no full-attention group looked up, or no position known)."""
        reach = None
        for group in self._keys.groups(req_context):
            if not group.admitted or group.windowed or not group.keys:
                continue
            end = group.ends[min(group.first + self._run_blocks, len(group.keys)) - 1]
            if end is not None:
                reach = end if reach is None else min(reach, end)
        return reach

    def _admit(self, key: BlockHash, req_context: Any) -> None:
        """At the first lookup of a request's KV cache group: the policies see the
        group's whole request, the blocks vLLM's own cache served counted as reuses,
        as the reference engine's admission does; a shared tier is asked about the
        rest (``RequestKeys.admit``)."""
        admission = self._keys.admit(req_context, key)
        if admission is None:
            return
        request, first = admission
        request.first = first
        target = self.tiered or self.cpu
        target.lookup(request.keys, first)
        target.touch(request.keys)
        target.count_seen(request.keys[:first])
        if request.windowed and self.windows is not None:
            keys = request.keys[first : request.first_looked + 1]
            self.windows.ask(_window_token(req_context, key), keys)

    def _checking_window(self, key: BlockHash, req_context: Any) -> bool:
        """Whether Redis is being asked about ``key``'s windowed group (``windows``).

        A group found windowed only now (vLLM's first lookup of the request was this
        group's rightmost block: a model without a full-attention group) is asked
        about from its first block: where vLLM's own cache stopped is not known.
        """
        if self.windows is None:
            return False
        request = self._keys.of(req_context, key)
        token = _window_token(req_context, key)
        if request.looked_up(key):
            self.windows.ask(token, request.keys[: request.first_looked + 1])
        return request.windowed and self.windows.asking(token)

    def _count(self, result_name: str, result: Any) -> Any:
        self.metrics.add(LOOKUPS, 1, (result_name,))
        return result

    # -- loads ------------------------------------------------------------------------

    def prepare_load(self, keys: Collection[Any], req_context: Any) -> Any:
        """Pin READY CPU blocks and say where they are (their use was counted when the
        request was looked up)."""
        ks = [BlockHash(bytes(k)) for k in keys]
        spec = self.cpu.prepare_load(ks)
        self.metrics.add(TIER_HITS, len(ks), ("cpu",))
        assert isinstance(spec, BlockIdsSpec)
        for group, n in Counter(group_of(k) for k in ks).items():
            self.metrics.add(LOADED_BLOCKS, n, (str(group),))
        return compat.CPULoadStoreSpec([int(b) for b in spec.block_ids])

    def touch(self, keys: Collection[Any], req_context: Any) -> None:
        ks = [BlockHash(bytes(k)) for k in keys]
        (self.tiered or self.cpu).touch(ks)

    def complete_load(self, keys: Collection[Any], req_context: Any) -> None:
        self.cpu.complete_load([BlockHash(bytes(k)) for k in keys])

    # -- stores -----------------------------------------------------------------------

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        """Choose the keys to store into the CPU tier, evicting by kvtier's policy."""
        self._poll()
        ks = [BlockHash(bytes(k)) for k in keys]
        target = self.tiered or self.cpu
        out = target.prepare_store(ks)
        first_of_group: dict[bytes, BlockHash] = {}
        for k in ks:
            first_of_group.setdefault(bytes(k)[-GROUP_SUFFIX:], k)
        for k in first_of_group.values():  # each group's request is the newest
            target.touch(self._keys.of(req_context, k).keys)
        if out is None:
            return None
        spec = out.store_spec
        assert isinstance(spec, BlockIdsSpec)
        return compat.PrepareStoreOutput(
            keys_to_store=[compat.OffloadKey(bytes(k)) for k in out.block_hashes_to_store],
            store_spec=compat.CPULoadStoreSpec([int(b) for b in spec.block_ids]),
            evicted_keys=[compat.OffloadKey(bytes(k)) for k in out.block_hashes_evicted],
        )

    def complete_store(self, keys: Collection[Any], req_context: Any, success: bool = True) -> None:
        """Blocks every rank stored become READY (and queued for disk / Redis); a block
        a rank failed to store (its status byte) is dropped instead."""
        ks = [BlockHash(bytes(k)) for k in keys]
        status = self.region.status()
        good: list[BlockHash] = []
        bad: list[BlockHash] = []
        for k in ks:
            slot = self.cpu.slot(k)
            failed = (
                slot is not None
                and self.cpu.state(k) is BlockState.STORING
                and bool((status[:, slot] == STORE_FAILED).any())
            )
            if slot is not None:
                status[:, slot] = STORE_OK
            (bad if failed or not success else good).append(k)
        target = self.tiered or self.cpu
        if good:
            target.complete_store(good, True)
        if bad:
            logger.warning("kvtier: %d block(s) failed to store and are dropped", len(bad))
            self.metrics.add(STORE_FAILURES, len(bad))
            target.complete_store(bad, False)
        self._start_writes()

    # -- requests and steps -----------------------------------------------------------

    def on_new_request(self, req_context: Any) -> Any:
        return compat.RequestOffloadingContext()

    def on_request_finished(self, req_context: Any) -> None:
        self._keys.forget(req_context)

    def on_schedule_end(self, context: Any) -> None:
        self._poll()
        self._start_writes()

    def has_pending_work(self) -> bool:
        """True while promotions, write-throughs or Redis checks are in flight."""
        return bool(
            (self.mover is not None and self.mover.in_flight)
            or (self.tiered is not None and self.tiered.has_pending_work)
            or (self.windows is not None and self.windows.in_flight)
        )

    def take_events(self) -> Iterable[Any]:
        """Every tier's stored / removed blocks as vLLM ``OffloadingEvent``s.

        The CPU tier is vLLM's ``CPU`` medium (the primary: no ownership); disk is
        ``STORAGE``/``LOCAL`` and Redis ``STORAGE``/``REMOTE``, owned by ``kvtier-disk``
        and ``kvtier-redis`` (vLLM's names for a secondary tier's events).
        """
        tiers = [self.cpu, *(self.tiered.secondaries if self.tiered is not None else ())]
        for tier in tiers:
            medium, locality, owner = _EVENT_SOURCE[tier.medium]
            for event in tier.take_events():
                yield compat.OffloadingEvent(
                    keys=[compat.OffloadKey(bytes(k)) for k in event.block_hashes],
                    medium=medium,
                    removed=event.removed,
                    locality=locality,
                    ownership=owner,
                )

    def get_stats(self) -> Any:
        """What vLLM's metrics channel gets each step (see ``metrics``)."""
        tiers = [self.cpu, *(self.tiered.secondaries if self.tiered is not None else ())]
        return self.metrics.take({(TIER_NAMES[t.medium],): len(t) for t in tiers})

    def reset_cache(self) -> None:
        """Forget every CPU block that nothing pins (a prefix-cache reset)."""
        self._poll()
        self.cpu.discard(self.cpu.keys())

    def on_reset_flushed(self) -> None:
        return None

    def shutdown(self) -> None:
        """Finish in-flight tier jobs, stop the threads, close the stores and the region."""
        if self.tiered is not None:
            self.tiered.shutdown()  # its existence checks
        if self.windows is not None:
            self.windows.shutdown()
        if self.mover is not None:
            self.mover.shutdown()
            self._poll()
        if self._on_shutdown is not None:
            self._on_shutdown()

    # -- internals --------------------------------------------------------------------

    def _poll(self) -> None:
        if self.windows is not None:
            self.windows.adopt()
        if self.mover is None:
            return
        tiered = self.tiered
        assert tiered is not None
        for job_id, job, ok, error in self.mover.poll():
            kind = self._kinds.pop(job_id)
            n = len(job.block_hashes)
            if kind == "promote":
                tier = TIER_NAMES[job.src.medium]
                self.metrics.add(
                    PROMOTIONS if ok else PROMOTION_FAILURES,
                    n,
                    (tier,) if ok else (tier, failure_reason(error)),
                )
                if not ok:
                    logger.warning("kvtier: promotion failed, recomputing: %s", error)
                    for key in job.block_hashes:
                        self._refused[key] = None
                    while len(self._refused) > REFUSED_CAP:
                        self._refused.popitem(last=False)
                tiered.complete_promotion(job, ok)
            else:
                if not ok:
                    logger.warning("kvtier: write-through failed: %s", error)
                    reason = failure_reason(error)
                    self.metrics.add(WRITE_FAILURES, n, (TIER_NAMES[job.dst.medium], reason))
                tiered.complete_write(job, ok)

    def _start_writes(self) -> None:
        if self.tiered is None or self.mover is None:
            return
        for job in self.tiered.prepare_writes():
            self._submit(job, "write")

    def _submit(self, job: TierJob, kind: str) -> None:
        assert self.mover is not None
        self._kinds[self.mover.submit(job)] = kind
