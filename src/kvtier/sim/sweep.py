"""Capacity sweeps: every policy at every capacity, with Belady at each capacity.

Runs in the ``kvtier simulate`` process. Each point is an independent replay through
a fresh manager (``kvtier.sim.replay``); Belady is computed once per capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvtier.sim.belady import belady
from kvtier.sim.capacity import Capacity
from kvtier.sim.metrics import HitRatios
from kvtier.sim.progress import Progress
from kvtier.sim.replay import ReplayResult, replay
from kvtier.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One capacity of a sweep.

    Attributes:
        capacity: the capacity as written (``5%``).
        capacity_blocks: what it resolved to for this trace.
        runs: one replay per policy, in the order asked.
        belady: Belady's reference at this capacity (``None`` if not computed).
    """

    capacity: str
    capacity_blocks: int
    runs: tuple[ReplayResult, ...]
    belady: HitRatios | None


def run_sweep(
    trace: Trace,
    capacities: Sequence[Capacity],
    policies: Sequence[str],
    *,
    kv_bytes_per_token: int | None = None,
    store_threshold: int = 0,
    disk_capacity: Capacity | None = None,
    with_belady: bool = True,
    progress: Progress | None = None,
) -> tuple[SweepPoint, ...]:
    """Replay ``trace`` for each capacity and policy.

    With ``disk_capacity``, each replay is tiered: the capacity swept is the CPU
    tier's, with a disk tier of ``disk_capacity`` behind it, and Belady is computed at
    the larger of the two (an inclusive hierarchy holds no more distinct blocks).

    Raises:
        ConfigError: an unknown policy, or a byte capacity without bytes per token.
    """
    points: list[SweepPoint] = []
    for capacity in capacities:
        blocks = capacity.blocks(
            distinct_blocks=trace.num_distinct_blocks,
            block_size=trace.block_size,
            kv_bytes_per_token=kv_bytes_per_token,
        )
        disk = (
            disk_capacity.blocks(
                distinct_blocks=trace.num_distinct_blocks,
                block_size=trace.block_size,
                kv_bytes_per_token=kv_bytes_per_token,
            )
            if disk_capacity is not None
            else 0
        )
        runs = tuple(
            replay(
                trace,
                blocks,
                policy,
                store_threshold=store_threshold,
                disk_capacity_blocks=disk,
                progress=progress,
            )
            for policy in policies
        )
        reference = belady(trace, max(blocks, disk), progress) if with_belady else None
        points.append(SweepPoint(capacity.text, blocks, runs, reference))
    return tuple(points)


def run_to_json(result: ReplayResult) -> dict[str, object]:
    """One replay as JSON-ready values (ratios at the top level)."""
    out: dict[str, object] = {
        "policy": result.policy,
        "capacity_blocks": result.capacity_blocks,
        "disk_capacity_blocks": result.disk_capacity_blocks,
        "store_threshold": result.store_threshold,
        **asdict(result.ratios),
        "tiers": [asdict(tier) for tier in result.tiers],
        "manager_stats": None if result.stats is None else asdict(result.stats),
        "replay_seconds": result.seconds,
        "block_accesses_per_second": result.accesses_per_second,
    }
    return out


def point_to_json(point: SweepPoint) -> dict[str, object]:
    """One capacity as JSON-ready values, Belady's ratios prefixed ``belady_``."""
    out: dict[str, object] = {
        "capacity": point.capacity,
        "capacity_blocks": point.capacity_blocks,
        "runs": [run_to_json(run) for run in point.runs],
    }
    if point.belady is not None:
        out["belady_block_hit_ratio"] = point.belady.block_hit_ratio
        out["belady_token_hit_ratio"] = point.belady.token_hit_ratio
        out["belady_request_hit_ratio_mean"] = point.belady.request_hit_ratio_mean
    return out
