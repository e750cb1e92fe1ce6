"""kvtier's counters through vLLM's metrics channel (``vllm:kv_offload_kvtier_*``).

vLLM (0.32 and 0.33 alike) asks the spec class for the metrics it may emit
(``build_metric_definitions``, read by the Prometheus logger in the API server) and
asks the manager, once per scheduler step, for what changed since the last call
(``get_stats``: an ``OffloadingConnectorStats``; counters are increments, gauges
snapshots). vLLM sums the payload into its Prometheus metrics and its log line.

=============================================  =========  ==========================
metric                                         labels     counts
=============================================  =========  ==========================
``vllm:kv_offload_kvtier_lookups``             result     vLLM's per-key lookups:
                                                          hit, pending, retry, miss
``vllm:kv_offload_kvtier_tier_hits``           tier       blocks found in a tier:
                                                          cpu (loaded by vLLM),
                                                          disk / redis (a promotion
                                                          started)
``vllm:kv_offload_kvtier_loaded_blocks``       group      blocks vLLM loads from the
                                                          CPU tier, by KV cache
                                                          group index
``vllm:kv_offload_kvtier_promotions``          tier       blocks promoted into CPU
``vllm:kv_offload_kvtier_promotion_failures``  tier,      blocks a promotion could
                                               reason     not deliver (recomputed)
``vllm:kv_offload_kvtier_write_failures``      tier,      blocks a write-through
                                               reason     could not write
``vllm:kv_offload_kvtier_store_failures``      (none)     GPU -> CPU blocks dropped
``vllm:kv_offload_kvtier_blocks``              tier       gauge: blocks each tier
                                                          holds now
=============================================  =========  ==========================

``reason`` is ``corrupt`` (a block failed verification: a ``Corruption`` word) or
``unavailable`` (anything else: a file gone, Redis down or timing out).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvtier.blocks import Medium
from kvtier.integrations.vllm import compat

LOOKUPS = "vllm:kv_offload_kvtier_lookups"
TIER_HITS = "vllm:kv_offload_kvtier_tier_hits"
LOADED_BLOCKS = "vllm:kv_offload_kvtier_loaded_blocks"
PROMOTIONS = "vllm:kv_offload_kvtier_promotions"
PROMOTION_FAILURES = "vllm:kv_offload_kvtier_promotion_failures"
WRITE_FAILURES = "vllm:kv_offload_kvtier_write_failures"
STORE_FAILURES = "vllm:kv_offload_kvtier_store_failures"
BLOCKS = "vllm:kv_offload_kvtier_blocks"

TIER_NAMES = {Medium.CPU: "cpu", Medium.DISK: "disk", Medium.REMOTE: "redis"}
"""The ``tier`` label of each medium."""


def definitions() -> dict[str, Any]:
    """The metrics kvtier's spec declares to vLLM (``build_metric_definitions``)."""
    counter, gauge = compat.OffloadingCounterMetadata, compat.OffloadingGaugeMetadata
    return {
        LOOKUPS: counter("kvtier: vLLM's offload lookups, by answer", ("result",)),
        TIER_HITS: counter("kvtier: blocks found for vLLM, by the tier holding them", ("tier",)),
        LOADED_BLOCKS: counter(
            "kvtier: blocks vLLM loads from the CPU tier, by KV cache group", ("group",)
        ),
        PROMOTIONS: counter("kvtier: blocks promoted into the CPU tier", ("tier",)),
        PROMOTION_FAILURES: counter(
            "kvtier: blocks a promotion could not deliver (recomputed)", ("tier", "reason")
        ),
        WRITE_FAILURES: counter(
            "kvtier: blocks a write-through to disk or Redis failed to write", ("tier", "reason")
        ),
        STORE_FAILURES: counter("kvtier: GPU -> CPU blocks a rank failed to store (dropped)"),
        BLOCKS: gauge("kvtier: blocks each tier holds", ("tier",)),
    }


def failure_reason(error: str | None) -> str:
    """``corrupt`` when a block failed verification (the error names one of
    ``block_format.Corruption``'s words), else ``unavailable``."""
    from kvtier.media.block_format import Corruption

    if error is not None and any(f": {c.value}:" in error for c in Corruption):
        return "corrupt"
    return "unavailable"


class KvtierCounters:
    """kvtier's counters, kept as totals and handed to vLLM as increments.

    Only the scheduler thread calls it (as the manager it belongs to).
    """

    def __init__(self) -> None:
        self._totals: Counter[tuple[str, tuple[str, ...]]] = Counter()
        self._reported: Counter[tuple[str, tuple[str, ...]]] = Counter()

    def add(self, name: str, n: int = 1, labels: tuple[str, ...] = ()) -> None:
        if n:
            self._totals[(name, labels)] += n

    def total(self, name: str, labels: tuple[str, ...] = ()) -> int:
        """Everything counted so far (reported or not)."""
        return self._totals[(name, labels)]

    def take(self, gauges: dict[tuple[str, ...], int]) -> Any:
        """vLLM's stats payload: counters since the last call, and the ``BLOCKS``
        gauges (labels -> value). Always a payload: the gauges are always news."""
        stats = compat.OffloadingConnectorStats()
        for (name, labels), value in self._totals.items():
            delta = value - self._reported[(name, labels)]
            if delta:
                stats.increase_counter(name, delta, labels)
        self._reported = Counter(self._totals)
        for labels, value in gauges.items():
            stats.set_gauge(BLOCKS, value, labels)
        return stats
