"""Trace replay through the real scheduler-side manager.

Runs in the ``kvtier simulate`` process; pure Python, no torch. The replay drives the
same ``OffloadingManager`` code, with the same eviction policies, that an engine runs
-- not a model of them -- following the engine's flow for each request
(``scheduler.serve.serve_request``: look up, touch, store the rest, touch again).

Stores complete at once (no transfer is simulated), so nothing is held between
requests. A capacity of 0 blocks caches nothing: every request misses, and no manager
is built (a manager needs at least one slot).

With a disk capacity, the replay drives the real ``TieredManager``: a CPU tier with a
disk tier behind it, inclusive and write-through as an engine deploys it. Per request,
after the lookup, the blocks found only on disk are promoted into the CPU tier, and
after the store every block that became ready in the CPU tier is written through to
disk at once. Hits are reported per tier (a block in both counts for CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.blocks import Medium
from kvtier.errors import ConfigError
from kvtier.scheduler import CPUOffloadingManager, ManagerStats, OffloadingManager
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.policies import make_policy
from kvtier.scheduler.serve import serve_request
from kvtier.scheduler.tiering import TieredManager
from kvtier.sim.metrics import HitCounter, HitRatios
from kvtier.sim.progress import Progress
from kvtier.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class TierHits:
    """What one tier served.

    Attributes:
        medium: the tier's medium (``"CPU"``, later ``"DISK"``, ``"REMOTE"``).
        capacity_blocks: the tier's capacity.
        hit_blocks: prefix-hit blocks this tier served.
        block_hit_ratio: ``hit_blocks`` / all block references of the trace.
    """

    medium: str
    capacity_blocks: int
    hit_blocks: int
    block_hit_ratio: float


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of one replay.

    Attributes:
        policy: the eviction policy's registered name.
        capacity_blocks: capacity of the (primary) tier.
        disk_capacity_blocks: capacity of the disk tier behind it (0: none).
        store_threshold: the manager's reuse-gated admission threshold.
        ratios: overall hit ratios (all tiers together).
        tiers: per tier, primary first.
        stats: the (primary) manager's counters at the end (``None`` at capacity 0).
        seconds: wall time of the replay loop.
        disk_capacity_blocks: capacity of the disk tier behind it (0: none).
    """

    policy: str
    capacity_blocks: int
    store_threshold: int
    ratios: HitRatios
    tiers: tuple[TierHits, ...]
    stats: ManagerStats | None
    seconds: float
    disk_capacity_blocks: int = 0

    @property
    def accesses_per_second(self) -> float:
        """Block references replayed per second of wall time."""
        return self.ratios.block_refs / self.seconds if self.seconds > 0 else 0.0


AfterRequest = Callable[[OffloadingManager], None]
"""Called with the manager after each request (for checks in tests)."""


def replay(
    trace: Trace,
    capacity_blocks: int,
    policy: str = "lru",
    *,
    store_threshold: int = 0,
    disk_capacity_blocks: int = 0,
    progress: Progress | None = None,
    after_request: AfterRequest | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a ``CPUOffloadingManager`` of ``capacity_blocks``.

    Args:
        trace: the requests to replay, in order.
        capacity_blocks: slots of the tier (``0``: cache nothing).
        policy: a name registered in ``kvtier.scheduler.policies.POLICIES`` (every
            tier's).
        store_threshold: the manager's admission threshold (``0``: store everything).
        disk_capacity_blocks: slots of a disk tier behind the CPU tier (``0``: none;
            see the module doc).
        progress: advanced by one per request, if given.
        after_request: called with the manager after each request, if given.

    Raises:
        ConfigError: unknown policy, negative capacity or bad threshold.
    """
    if disk_capacity_blocks < 0:
        raise ConfigError("disk_capacity_blocks", f"must be >= 0, got {disk_capacity_blocks}")
    if capacity_blocks == 0:
        return _replay_nothing(trace, policy, store_threshold, progress)
    if disk_capacity_blocks:
        return _replay_tiered(
            trace,
            capacity_blocks,
            disk_capacity_blocks,
            policy,
            store_threshold=store_threshold,
            progress=progress,
            after_request=after_request,
        )
    manager = CPUOffloadingManager(
        num_blocks=capacity_blocks,
        block_size=trace.block_size,
        eviction_policy=policy,
        enable_events=False,
        store_threshold=store_threshold,
    )
    counter = HitCounter(trace.block_size)
    add = counter.add
    advance = progress.advance if progress is not None else None
    start = time.perf_counter()
    for request in trace.requests:
        keys = request.keys
        hit = serve_request(manager, keys)
        add(hit, len(keys), request.input_length)
        if after_request is not None:
            after_request(manager)
        if advance is not None:
            advance()
    seconds = time.perf_counter() - start
    ratios = counter.ratios()
    tier = TierHits(
        medium=str(manager.medium),
        capacity_blocks=capacity_blocks,
        hit_blocks=ratios.hit_blocks,
        block_hit_ratio=ratios.block_hit_ratio,
    )
    return ReplayResult(
        policy=policy,
        capacity_blocks=capacity_blocks,
        store_threshold=store_threshold,
        ratios=ratios,
        tiers=(tier,),
        stats=manager.stats(),
        seconds=seconds,
    )


def _replay_nothing(
    trace: Trace, policy: str, store_threshold: int, progress: Progress | None
) -> ReplayResult:
    from kvtier.scheduler.policies import make_policy

    make_policy(policy, 1)  # still reject an unknown policy name
    counter = HitCounter(trace.block_size)
    for request in trace.requests:
        counter.add(0, len(request.keys), request.input_length)
        if progress is not None:
            progress.advance()
    ratios = counter.ratios()
    return ReplayResult(
        policy=policy,
        capacity_blocks=0,
        store_threshold=store_threshold,
        ratios=ratios,
        tiers=(TierHits("CPU", 0, 0, 0.0),),
        stats=None,
        seconds=0.0,
    )


def _replay_tiered(
    trace: Trace,
    capacity_blocks: int,
    disk_capacity_blocks: int,
    policy: str,
    *,
    store_threshold: int,
    progress: Progress | None,
    after_request: AfterRequest | None,
) -> ReplayResult:
    """The replay through a ``TieredManager``: CPU in front of disk (module doc)."""
    cpu = CPUOffloadingManager(
        num_blocks=capacity_blocks,
        block_size=trace.block_size,
        eviction_policy=policy,
        store_threshold=store_threshold,
    )
    disk = TierManager(
        medium=Medium.DISK,
        num_blocks=disk_capacity_blocks,
        block_size=trace.block_size,
        policy=make_policy(policy, disk_capacity_blocks),
    )
    # Writes are drained after every request: the queue never holds more than one
    # request's new blocks, so none is skipped for want of queue room.
    tiers = TieredManager(cpu, [disk], max_pending_writes=max(1024, capacity_blocks))
    counter = HitCounter(trace.block_size)
    cpu_hits = 0
    ready = BlockState.READY
    start = time.perf_counter()
    for request in trace.requests:
        keys = request.keys
        hit = tiers.lookup(keys)
        in_cpu = sum(1 for key in keys[:hit] if cpu.state(key) is ready)
        tiers.touch(keys)
        jobs = tiers.prepare_promotion(keys[:hit]) if hit > in_cpu else []
        if jobs is None:  # the CPU tier cannot make room: only its own run is served
            hit = next((i for i, key in enumerate(keys) if cpu.state(key) is not ready), hit)
            in_cpu = hit
        for job in jobs or ():
            tiers.complete_promotion(job, success=True)
        cpu_hits += in_cpu
        out = tiers.prepare_store(keys[hit:])
        tiers.touch(keys)
        if out is not None:
            tiers.complete_store(out.block_hashes_to_store)
        for job in tiers.prepare_writes():
            tiers.complete_write(job, success=True)
        counter.add(hit, len(keys), request.input_length)
        if after_request is not None:
            after_request(tiers)
        if progress is not None:
            progress.advance()
    seconds = time.perf_counter() - start
    ratios = counter.ratios()
    refs = ratios.block_refs
    hits = {cpu.medium: cpu_hits, disk.medium: ratios.hit_blocks - cpu_hits}
    return ReplayResult(
        policy=policy,
        capacity_blocks=capacity_blocks,
        store_threshold=store_threshold,
        ratios=ratios,
        tiers=tuple(
            TierHits(str(t.medium), t.num_blocks, hits[t.medium], _ratio(hits[t.medium], refs))
            for t in (cpu, disk)
        ),
        stats=cpu.stats(),
        seconds=seconds,
        disk_capacity_blocks=disk_capacity_blocks,
    )


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
