"""``EngineObserver``: an engine's values in, metrics, failure counts and KV events out.

Runs in the engine's thread. It consumes only values kvtier already produces, so it
does not depend on how a connector is built:

* every finished job, ``(TransferSpec, TransferResult)``, from the worker
  (``OffloadingConnector.add_observer``): transfer metrics, failures by tier and reason;
* each ``generate`` call's ``EngineStats``: engine and offload metrics; the failures
  counted since the last call are put into its ``OffloadStats.failures``;
* the managers' cumulative counters (``ManagerStats``, ``TieringStats``), read as
  snapshots after each call and added to counters as differences;
* the managers' ``OffloadingEvent``s (``take_events``), published as KV events.

Recording never stops the engine: a metric or event that cannot be recorded is
counted (``guard.failures``) and logged once (``RecordingGuard``).

At start the blocks a tier already holds (a disk tier's recovered blocks) are
published as stored, and at ``close`` an ``AllBlocksCleared`` says the engine holds
nothing any more, so a subscriber's picture matches the engine's from first to last.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvtier.blocks import Medium
from kvtier.load_store_specs import BlockIdsSpec
from kvtier.observability.failures import FailureLog, classify, job_tier
from kvtier.observability.guard import RecordingGuard
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.protocol import OffloadingEvent
from kvtier.scheduler.tiering import TieredManager

if TYPE_CHECKING:
    from kvtier.engine.stats import EngineStats
    from kvtier.jobs import TransferResult, TransferSpec
    from kvtier.observability.metrics import EngineMetrics
    from kvtier.observability.publisher import ZmqEventPublisher

_SECONDARY = (Medium.DISK, Medium.REMOTE)


def _state_of(breaker: Any) -> str:
    return str(breaker.state.value)


class EngineObserver:
    """Feeds an engine's metrics, failure log and KV events. See the module docstring.

    Args:
        manager: the scheduler-side manager (every tier).
        bytes_per_block: bytes of one offloaded block (for occupancy in bytes).
        shared: stores of shared tiers by medium; each has ``breaker`` (a
            ``CircuitBreaker``) and ``outages``.
        where: how each tier is named in log lines (a path, a URL; redacted here).
        metrics: the engine's metrics, or ``None`` (no ``prometheus_client``).
        publisher: where KV events go, or ``None``.
        int_hashes: events carry 64-bit integers instead of key bytes.
    """

    def __init__(
        self,
        manager: TieredManager,
        bytes_per_block: int,
        *,
        shared: Mapping[Medium, Any] | None = None,
        where: dict[Medium, str] | None = None,
        metrics: EngineMetrics | None = None,
        publisher: ZmqEventPublisher | None = None,
        int_hashes: bool = False,
    ) -> None:
        self.manager = manager
        self.tiers: tuple[TierManager, ...] = (manager.primary, *manager.secondaries)
        self.block_size = self.tiers[0].block_size
        self.shared = dict(shared or {})
        self.failures = FailureLog(where)
        self.metrics = metrics
        self.publisher = publisher
        self.int_hashes = int_hashes
        self.guard = RecordingGuard()
        self._seen: dict[str, int] = {}  # cumulative counters already added to metrics
        if metrics is not None:
            for tier in self.tiers:
                metrics.watch_tier(tier.medium, tier.__len__, tier.num_blocks, bytes_per_block)
            metrics.write_queue.set_function(lambda: float(manager.pending_writes))
            for medium, store in self.shared.items():
                states = [s.value for s in type(store.breaker.state)]
                metrics.watch_breaker(medium, functools.partial(_state_of, store.breaker), states)
        resident = []
        for tier in self.tiers:
            held = tier.keys()  # a TierManager is not iterable
            ready = tuple(k for k in held if tier.state(k) is BlockState.READY)
            if ready:
                resident.append(OffloadingEvent(ready, self.block_size, tier.medium, False))
        self._publish(resident)

    # -- jobs --------------------------------------------------------------------------

    def on_transfer(self, spec: TransferSpec | None, result: TransferResult) -> None:
        """One finished job (an ``OffloadingConnector`` observer). Never raises."""
        self.guard.run("metrics", lambda: self._on_transfer(spec, result), None)

    def _on_transfer(self, spec: TransferSpec | None, result: TransferResult) -> None:
        try:
            src, dst = spec[0].medium, spec[1].medium  # type: ignore[index]
        except (TypeError, IndexError, AttributeError):
            src = dst = None
        if src is None or dst is None:
            if not result.success:
                self.failures.log_once(Medium.GPU, "invalid", f"malformed job: {result.error}")
            return
        side = spec[1] if src is Medium.GPU else spec[0]  # type: ignore[index]
        blocks = len(side) if isinstance(side, BlockIdsSpec) else 0
        if not result.success:
            tier, op = job_tier(src, dst)
            self.failures.record(tier, op, result.error, blocks)
        m = self.metrics
        if m is None:
            return
        outcome = "ok" if result.success else "failed"
        m.jobs.labels(src, dst, outcome).inc()
        m.job_blocks.labels(src, dst, outcome).inc(blocks)
        m.job_bytes.labels(src, dst).inc(result.bytes_moved)
        if result.success or result.seconds > 0:
            m.job_seconds.labels(src, dst).observe(result.seconds)
        if result.success and dst is Medium.CPU and src in _SECONDARY:
            m.promoted.labels(src).inc(blocks)
        if result.success and src is Medium.CPU and dst in _SECONDARY:
            m.written.labels(dst).inc(blocks)

    # -- generate calls ----------------------------------------------------------------

    def finish_generate(self, stats: EngineStats) -> EngineStats:
        """``stats`` with the failures since the last call; records and publishes them."""
        failures = self.failures.take()
        if failures:
            merged = dict(stats.offload.failures)
            for key, n in failures.items():
                merged[key] = merged.get(key, 0) + n
            offload = dataclasses.replace(stats.offload, failures=merged)
            stats = dataclasses.replace(stats, offload=offload)
        metrics = self.metrics
        if metrics is not None:
            self.guard.run("metrics", lambda: record_stats(metrics, stats, self.block_size), None)
        self.step()
        return stats

    def step(self) -> None:
        """Record the managers' counters and publish their events.

        ``finish_generate`` calls it; an engine without ``EngineStats`` (an adapter
        inside another engine) calls it once per step instead, and its failures go
        to the metrics here. Never raises: what cannot be recorded is counted by
        ``guard`` and logged once.
        """
        self.guard.run("metrics", self._record_step, None)
        events = self.manager.take_events()
        self.guard.run("events", lambda: self._publish(events), None)

    def _record_step(self) -> None:
        self._watch_shared()
        if self.metrics is not None:
            for key, n in self.failures.take().items():
                self.metrics.failed.labels(key.tier, key.op, key.reason).inc(n)
            self._record_managers()

    def close(self) -> None:
        """After the connector closed: the last counts and events, then ``AllBlocksCleared``."""
        self.step()
        self.guard.run("events", lambda: self._publish([], cleared=True), None)
        if self.publisher is not None:
            self.publisher.close()

    # -- internals ---------------------------------------------------------------------

    def _watch_shared(self) -> None:
        """Log a shared tier found unhealthy once (lookups fail silently), count outages."""
        for medium, store in self.shared.items():
            breaker = store.breaker
            error = breaker.last_error
            if error is not None and breaker.state.value != "healthy":
                self.failures.log_once(medium, classify(error), f"the store failed: {error}")
            if self.metrics is not None:
                outages = self._delta(f"outages.{medium}", store.outages)
                self.metrics.outages.labels(medium).inc(outages)

    def _delta(self, name: str, value: int) -> int:
        delta = value - self._seen.get(name, 0)
        self._seen[name] = value
        return delta

    def _record_managers(self) -> None:
        m, d = self.metrics, self._delta
        assert m is not None
        primary = self.tiers[0].stats()
        m.lookups.inc(d("lookups", primary.lookups))
        m.lookup_blocks.inc(d("lookup_blocks", primary.lookup_blocks))
        m.skipped.labels("admission").inc(d("admission", primary.stores_skipped))
        for tier in self.tiers:
            m.evicted.labels(tier.medium).inc(d(f"evictions.{tier.medium}", tier.stats().evictions))
        tiering = self.manager.stats()
        for medium, n in tiering.hit_blocks.items():
            m.lookup_hit_blocks.labels(medium).inc(d(f"hits.{medium}", n))
        m.skipped.labels("write_through").inc(d("write_through", tiering.writes_skipped))

    def _publish(self, events: Sequence[OffloadingEvent] | Any, cleared: bool = False) -> None:
        if self.publisher is None:
            return
        from kvtier.observability.events import AllBlocksCleared, KVEventBatch, to_kv_events

        out: list[Any] = list(to_kv_events(events, self.int_hashes))
        if cleared:
            out.append(AllBlocksCleared())
        if not out:
            return
        self.publisher.publish(KVEventBatch(ts=time.time(), events=out))
        if self.metrics is not None:
            for event in out:
                self.metrics.events.labels(type(event).__name__).inc()
            self.metrics.event_batches_dropped.inc(self._delta("dropped", self.publisher.dropped))


def record_stats(m: EngineMetrics, stats: EngineStats, offload_block_size: int) -> None:
    """Add one ``generate`` call's stats to the counters (with or without offloading)."""
    m.requests.inc(len(stats.requests))
    m.prompt_tokens.inc(stats.prompt_tokens)
    m.computed_tokens.inc(sum(r.computed_tokens for r in stats.requests))
    m.preemptions.inc(sum(r.preemptions for r in stats.requests))
    for r in stats.requests:
        m.ttft.observe(r.ttft_s)
    m.hit_blocks.labels(Medium.GPU).inc(stats.gpu_hit_blocks)
    m.hit_tokens.labels(Medium.GPU).inc(stats.gpu_hit_tokens)
    off = stats.offload
    for medium, n in off.hit_blocks.items():
        m.hit_blocks.labels(medium).inc(n)
        m.hit_tokens.labels(medium).inc(n * offload_block_size)
    for key, n in off.failures.items():
        m.failed.labels(key.tier, key.op, key.reason).inc(n)
    if off.refused_stores or off.refused_loads:
        m.refused.labels(Medium.CPU, "store").inc(off.refused_stores)
        m.refused.labels(Medium.CPU, "load").inc(off.refused_loads)
