"""``EngineMetrics``: kvtier's Prometheus metrics, in a registry of their own.

Runs in the engine process. Values are fed from what kvtier already produces -- each
``generate`` call's ``EngineStats`` (with its ``OffloadStats``), snapshots of the
managers' counters (``ManagerStats``, ``TieringStats``) and each finished job's
``TransferResult`` -- never from a connector's internals. Gauges of tier occupancy,
the write-through queue and a shared tier's circuit breaker are read live at scrape
time. Every label is bounded: ``tier``/``src``/``dst`` are media, ``op`` is
``load``/``store``, ``reason`` one of ``failures.REASONS``; never a key or request id.

The registry is this engine's alone (``registry``): serve it with ``MetricsServer``,
or mount it in an embedding engine's own exposition (``prometheus_client`` accepts
it wherever a registry or collector is taken). The full list is in
``docs/observability.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvtier.blocks import Medium

TRANSFER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds per transfer job: a page copy takes ~0.1 ms, a Redis timeout ~1 s."""

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineMetrics:
    """The metric families of one engine (see the module docstring).

    Args:
        registry: where to register them (a new ``CollectorRegistry`` by default;
            never the process-global one, so engines do not collide).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        # The engine (EngineStats of each generate call).
        self.requests = Counter("kvtier_requests", "Requests served.", registry=r)
        self.prompt_tokens = Counter("kvtier_prompt_tokens", "Prompt tokens sent.", registry=r)
        self.computed_tokens = Counter(
            "kvtier_computed_tokens",
            "Prompt tokens run through the model (neither cached nor loaded).",
            registry=r,
        )
        self.preemptions = Counter("kvtier_preemptions", "Requests preempted.", registry=r)
        self.ttft = Histogram(
            "kvtier_ttft_seconds", "Time to first token.", buckets=TTFT_BUCKETS, registry=r
        )
        self.hit_blocks = Counter(
            "kvtier_hit_blocks",
            "Blocks served from a tier instead of computed: GPU (prefix cache, engine "
            "pages) or an offloaded tier (offloaded blocks), by the tier that held them.",
            ["tier"],
            registry=r,
        )
        self.hit_tokens = Counter(
            "kvtier_hit_tokens",
            "Prompt tokens served from a tier instead of computed.",
            ["tier"],
            registry=r,
        )
        # The connector (OffloadStats of each generate call).
        self.failed = Counter(
            "kvtier_failed_blocks",
            "Blocks whose load or store failed, by tier, operation and reason.",
            ["tier", "op", "reason"],
            registry=r,
        )
        self.refused = Counter(
            "kvtier_refused_blocks",
            "Blocks not stored or loaded because the tier could not make room.",
            ["tier", "op"],
            registry=r,
        )
        # The managers (snapshots of cumulative counters).
        self.lookups = Counter("kvtier_lookups", "Offloading lookups.", registry=r)
        self.lookup_blocks = Counter(
            "kvtier_lookup_blocks", "Blocks asked about by lookups.", registry=r
        )
        self.lookup_hit_blocks = Counter(
            "kvtier_lookup_hit_blocks",
            "Blocks lookups reported ready, by the tier holding them.",
            ["tier"],
            registry=r,
        )
        self.evicted = Counter(
            "kvtier_evicted_blocks", "Blocks evicted to make room.", ["tier"], registry=r
        )
        self.skipped = Counter(
            "kvtier_skipped_blocks",
            "Blocks not stored by choice: reason=admission (store_threshold), "
            "write_through (secondary write queue full, or no room there).",
            ["reason"],
            registry=r,
        )
        self.promoted = Counter(
            "kvtier_promoted_blocks",
            "Blocks promoted from a secondary tier into the CPU tier.",
            ["tier"],
            registry=r,
        )
        self.written = Counter(
            "kvtier_written_blocks",
            "Blocks written through from the CPU tier to a secondary tier.",
            ["tier"],
            registry=r,
        )
        self.outages = Counter(
            "kvtier_tier_outages", "Outages of a shared tier's store.", ["tier"], registry=r
        )
        # Transfers (each finished job).
        self.jobs = Counter(
            "kvtier_transfer_jobs",
            "Transfer jobs finished, by medium pair and outcome.",
            ["src", "dst", "outcome"],
            registry=r,
        )
        self.job_blocks = Counter(
            "kvtier_transfer_blocks",
            "Offloaded blocks of finished transfer jobs.",
            ["src", "dst", "outcome"],
            registry=r,
        )
        self.job_bytes = Counter(
            "kvtier_transfer_bytes",
            "Bytes moved by transfer jobs.",
            ["src", "dst"],
            registry=r,
        )
        self.job_seconds = Histogram(
            "kvtier_transfer_seconds",
            "Seconds one transfer job took on its stream or thread.",
            ["src", "dst"],
            buckets=TRANSFER_BUCKETS,
            registry=r,
        )
        # KV events.
        self.events = Counter(
            "kvtier_kv_events", "KV events published, by kind.", ["kind"], registry=r
        )
        self.event_batches_dropped = Counter(
            "kvtier_kv_event_batches_dropped",
            "KV event batches dropped because the publisher's queue was full.",
            registry=r,
        )
        # Live gauges (read at scrape time).
        self.tier_blocks = Gauge(
            "kvtier_tier_blocks", "Blocks resident in a tier.", ["tier"], registry=r
        )
        self.tier_capacity_blocks = Gauge(
            "kvtier_tier_capacity_blocks", "Blocks a tier can hold.", ["tier"], registry=r
        )
        self.tier_bytes = Gauge(
            "kvtier_tier_bytes", "Bytes of the blocks resident in a tier.", ["tier"], registry=r
        )
        self.tier_capacity_bytes = Gauge(
            "kvtier_tier_capacity_bytes",
            "Bytes of blocks a tier can hold (a shared tier: its index).",
            ["tier"],
            registry=r,
        )
        self.write_queue = Gauge(
            "kvtier_write_queue_blocks",
            "Blocks waiting in the write-through queues.",
            registry=r,
        )
        self.breaker = Gauge(
            "kvtier_tier_breaker_state",
            "Circuit-breaker state of a shared tier: 1 for the current state.",
            ["tier", "state"],
            registry=r,
        )

    def watch_tier(
        self, tier: Medium, resident: Callable[[], int], capacity: int, bytes_per_block: int
    ) -> None:
        """Read a tier's occupancy live: ``resident()`` blocks of ``bytes_per_block``."""
        name = str(tier)
        self.tier_blocks.labels(name).set_function(lambda: float(resident()))
        self.tier_bytes.labels(name).set_function(lambda: float(resident() * bytes_per_block))
        self.tier_capacity_blocks.labels(name).set(capacity)
        self.tier_capacity_bytes.labels(name).set(capacity * bytes_per_block)

    def watch_breaker(self, tier: Medium, state: Callable[[], str], states: list[str]) -> None:
        """Read a shared tier's breaker state live (one series per state, 1 or 0)."""
        for s in states:
            self.breaker.labels(str(tier), s).set_function(
                lambda s=s: 1.0 if state() == s else 0.0  # type: ignore[misc]
            )
