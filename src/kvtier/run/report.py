"""What ``kvtier run`` prints and records: TTFT statistics, speedups, hit ratios, bytes.

Runs in the ``kvtier run`` process; pure Python. ``summarize`` turns one configuration's
turns into figures; ``format_report`` prints them side by side, with speedups against
the ``none`` configuration (ratios of medians); ``to_json`` is the results document.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvtier.engine.connector_api import OffloadStats
from kvtier.run.job import ConfigRun, Mismatch
from kvtier.run.workload import Workload

BASELINE = "none"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), interpolating linearly between order statistics.

    The same definition as numpy's default: rank ``q / 100 * (n - 1)`` in the sorted
    values. ``nan`` for no values.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class TTFT:
    """Time to first token over a set of turns (``nan`` when the set is empty)."""

    count: int
    median_s: float
    p90_s: float

    @classmethod
    def of(cls, values: Sequence[float]) -> TTFT:
        median = statistics.median(values) if values else math.nan
        return cls(len(values), median, percentile(values, 90))


def speedup(baseline_s: float, value_s: float) -> float:
    """``baseline_s / value_s``; ``nan`` when either is missing or ``value_s`` is 0."""
    if math.isnan(baseline_s) or math.isnan(value_s) or value_s <= 0:
        return math.nan
    return baseline_s / value_s


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration's figures.

    Attributes:
        name: the configuration.
        all_turns: TTFT over every turn.
        late_turns: TTFT over turns with index >= ``late_turn``.
        by_turn: median TTFT per turn index.
        prompt_tokens: tokens sent, over all turns.
        gpu_hit_tokens: of those, served by the GPU prefix cache.
        offload_hit_tokens: of those, found offloaded, per tier.
        computed_tokens: prompt tokens run through the model.
        totals: blocks and bytes the connector moved, failures.
        wall_s: seconds in this configuration's ``generate`` calls.
    """

    name: str
    all_turns: TTFT
    late_turns: TTFT
    by_turn: Mapping[int, float]
    prompt_tokens: int
    gpu_hit_tokens: int
    offload_hit_tokens: Mapping[str, int]
    computed_tokens: int
    totals: OffloadStats
    wall_s: float

    def ratio(self, tokens: int) -> float:
        """``tokens`` as a share of the prompt tokens."""
        return tokens / self.prompt_tokens if self.prompt_tokens else math.nan


def summarize(run: ConfigRun, late_turn: int) -> Summary:
    """The figures of one configuration's run; turns ``>= late_turn`` count as late."""
    turns = run.turns
    by_index: dict[int, list[float]] = {}
    for t in turns:
        by_index.setdefault(t.turn, []).append(t.ttft_s)
    hits: dict[str, int] = {}
    for t in turns:
        for tier, n in t.offload_hit_tokens.items():
            hits[tier] = hits.get(tier, 0) + n
    return Summary(
        name=run.config.name,
        all_turns=TTFT.of([t.ttft_s for t in turns]),
        late_turns=TTFT.of([t.ttft_s for t in turns if t.turn >= late_turn]),
        by_turn={i: statistics.median(v) for i, v in sorted(by_index.items())},
        prompt_tokens=sum(t.prompt_tokens for t in turns),
        gpu_hit_tokens=sum(t.gpu_hit_tokens for t in turns),
        offload_hit_tokens=dict(sorted(hits.items())),
        computed_tokens=sum(t.computed_tokens for t in turns),
        totals=run.totals,
        wall_s=run.wall_s,
    )


def describe_setup(workload: Workload, gpu_blocks: int, block_size: int, kv_bytes: int) -> str:
    """The workload and the GPU pool, and whether the pool can keep the conversations."""
    spec = workload.spec
    finals = workload.final_history_tokens()
    pool_tokens = gpu_blocks * block_size
    keeps = "too small to keep" if pool_tokens < sum(finals) else "WARNING: big enough to keep"
    return (
        f"workload: {spec.conversations} conversations x {spec.turns} turns, system prompt "
        f"{spec.system_tokens} tokens, user {spec.user_tokens[0]}-{spec.user_tokens[1]}, "
        f"answers {spec.answer_tokens[0]}-{spec.answer_tokens[1]}, seed {spec.seed}; "
        f"prompts up to {max(t.prompt_tokens for t in workload.turns)} tokens\n"
        f"GPU pool: {gpu_blocks} pages x {block_size} tokens = {pool_tokens} tokens: holds the "
        f"largest turn ({workload.max_request_tokens} tokens), {keeps} the conversations "
        f"({sum(finals)} tokens at the end); workload KV {kv_bytes / 2**20:.1f} MiB"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _x(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.1f}x"


def headline(summary: Summary, baseline: Summary | None, identical: bool) -> str:
    """``cpu: late-turn TTFT median 0.21 s vs 4.8 s recompute (22.9x), outputs identical``."""
    late = summary.late_turns.median_s
    text = f"{summary.name}: late-turn TTFT median {late:.2f} s"
    if baseline is summary:
        return text + " (the baseline: whatever left the GPU is recomputed)"
    if baseline is not None:
        base = baseline.late_turns.median_s
        text += f" vs {base:.2f} s recompute ({_x(speedup(base, late))})"
    return text + (", outputs identical" if identical else ", OUTPUTS DIFFER")


def format_report(
    summaries: Sequence[Summary],
    mismatches: Sequence[Mismatch],
    late_turn: int,
    history_by_turn: Mapping[int, int],
) -> str:
    """The printed report: per-configuration table, per-turn TTFT, then headlines.

    Args:
        summaries: one per configuration, in run order.
        mismatches: turns whose outputs differ from the first configuration's.
        late_turn: first turn index counted as late.
        history_by_turn: median history tokens per turn index (for the per-turn table).
    """
    ran = list(summaries)
    base = next((s for s in ran if s.name == BASELINE), None)
    lines = [
        f"{'config':<9} {'TTFT median':>11} {'p90':>7} {'late median':>11} {'p90':>7} "
        f"{'speedup':>7}  {'gpu hit':>7} {'offl hit':>8} {'loaded':>10} {'stored':>10} "
        f"{'fail ld/st':>10}"
    ]
    for s in summaries:
        offl = sum(s.offload_hit_tokens.values())
        late_x = speedup(base.late_turns.median_s, s.late_turns.median_s) if base else math.nan
        lines.append(
            f"{s.name:<9} {s.all_turns.median_s:>10.2f}s {s.all_turns.p90_s:>6.2f}s "
            f"{s.late_turns.median_s:>10.2f}s {s.late_turns.p90_s:>6.2f}s {_x(late_x):>7}  "
            f"{s.ratio(s.gpu_hit_tokens):>7.1%} {s.ratio(offl):>8.1%} "
            f"{_mib(s.totals.bytes_loaded):>10} {_mib(s.totals.bytes_stored):>10} "
            f"{s.totals.failed_loads:>4}/{s.totals.failed_stores:<5}"
        )
    for s in ran:
        if s.totals.failures:
            failed = ", ".join(f"{k} {n}" for k, n in sorted(s.totals.failures.items()))
            lines.append(f"{s.name}: FAILED blocks by tier, operation and reason: {failed}")
    for s in ran:
        if s.offload_hit_tokens:
            tiers = ", ".join(
                f"{tier} {s.ratio(n):.1%}" for tier, n in s.offload_hit_tokens.items()
            )
            lines.append(f"{s.name}: offloaded hits per tier (share of prompt tokens): {tiers}")
    lines.append("")
    lines.append("median TTFT by turn index (speedup vs none):")
    header = f"{'turn':>4} {'history':>7}  " + "  ".join(f"{s.name:>16}" for s in ran)
    lines.append(header)
    for index in sorted(history_by_turn):
        cells = []
        for s in ran:
            value = s.by_turn.get(index, math.nan)
            ratio = speedup(base.by_turn.get(index, math.nan), value) if base else math.nan
            cell = f"{value:.2f}s" + ("" if s is base or not base else f" ({_x(ratio)})")
            cells.append(f"{cell:>16}")
        lines.append(f"{index:>4} {history_by_turn[index]:>7}  " + "  ".join(cells))
    lines.append("")
    if mismatches:
        lines.append(f"ERROR: {len(mismatches)} turn(s) generated different tokens:")
        for m in mismatches[:10]:
            lines.append(
                f"  {m.config} vs {m.baseline}: conversation {m.conversation} turn {m.turn}, "
                f"first difference at output token {m.position}"
            )
    bad = {m.config for m in mismatches}
    lines.append(f"late turns: turn index >= {late_turn}")
    lines.extend(headline(s, base, s.name not in bad) for s in summaries)
    return "\n".join(lines)


def to_json(
    runs: Sequence[ConfigRun], summaries: Sequence[Summary], mismatches: Sequence[Mismatch]
) -> dict[str, Any]:
    """The ``results`` part of the JSON document: summaries, mismatches, every turn."""
    base = next((s for s in summaries if s.name == BASELINE), None)
    configs: dict[str, Any] = {}
    for run, s in zip(runs, summaries, strict=True):
        late_x = speedup(base.late_turns.median_s, s.late_turns.median_s) if base else None
        doc: dict[str, Any] = {
            "offload": dict(run.config.offload) if run.config.offload is not None else None,
            "ttft_all": asdict(s.all_turns),
            "ttft_late": asdict(s.late_turns),
            "late_speedup_vs_none": late_x,
            "ttft_median_by_turn": {str(k): v for k, v in s.by_turn.items()},
            "prompt_tokens": s.prompt_tokens,
            "gpu_hit_tokens": s.gpu_hit_tokens,
            "offload_hit_tokens": dict(s.offload_hit_tokens),
            "gpu_hit_ratio": s.ratio(s.gpu_hit_tokens),
            "offload_hit_ratio": {k: s.ratio(n) for k, n in s.offload_hit_tokens.items()},
            "computed_tokens": s.computed_tokens,
            "offload_totals": asdict(replace(run.totals, failures={}))
            | {"failures": {str(k): n for k, n in sorted(run.totals.failures.items())}},
            "wall_s": s.wall_s,
            "turns": [
                {k: v for k, v in asdict(t).items() if k != "output"}
                | {"output_sha256_16": t.output_digest}
                for t in run.turns
            ],
        }
        configs[run.config.name] = doc
    document: dict[str, Any] = _finite(
        {
            "outputs_identical": not mismatches,
            "mismatches": [asdict(m) for m in mismatches],
            "configurations": configs,
        }
    )
    return document


def _finite(obj: Any) -> Any:
    """``obj`` with every ``nan`` replaced by ``None`` (JSON has no NaN)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
