"""Trace replay and capacity planning (``kvtier simulate``).

Runs in a plain Python process, scheduler side only (no torch). A trace is replayed
through the real ``OffloadingManager`` and its eviction policies, and compared with
Belady's offline reference at the same capacity::

    from kvtier.sim import read_mooncake, replay, belady
    trace = read_mooncake("synthetic_trace.jsonl")
    result = replay(trace, capacity_blocks=2196, policy="lru")
    result.ratios.block_hit_ratio, belady(trace, 2196).block_hit_ratio

Modules: ``trace`` (parsing), ``replay`` (the engine's flow through the manager),
``belady`` (the offline reference), ``metrics`` (the three hit ratios), ``capacity``
(``4096`` / ``5%`` / ``8GiB``), ``sweep`` and ``plot`` (hit ratio against capacity),
``workload`` (a seeded generator), ``progress`` and ``cli``.
"""

from kvtier.sim.belady import belady
from kvtier.sim.metrics import HitRatios
from kvtier.sim.replay import ReplayResult, TierHits, replay
from kvtier.sim.trace import Trace, TraceRequest, parse_mooncake, read_mooncake, trace_block_key

__all__ = [
    "HitRatios",
    "ReplayResult",
    "TierHits",
    "Trace",
    "TraceRequest",
    "belady",
    "parse_mooncake",
    "read_mooncake",
    "replay",
    "trace_block_key",
]
