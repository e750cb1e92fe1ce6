"""Report math on known numbers: percentiles, medians, speedups, ratios, JSON."""

from __future__ import annotations

import json
import math

import pytest

from kvtier.engine.connector_api import OffloadStats
from kvtier.run.configs import Configuration
from kvtier.run.job import ConfigRun, Mismatch, TurnResult
from kvtier.run.report import TTFT, format_report, percentile, speedup, summarize, to_json


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 10.0
    assert percentile([3.0], 90) == 3.0
    assert math.isnan(percentile([], 90))


def test_ttft_and_speedup() -> None:
    t = TTFT.of([4.0, 1.0, 2.0, 3.0])
    assert (t.count, t.median_s, t.p90_s) == (4, 2.5, pytest.approx(3.7))
    assert math.isnan(TTFT.of([]).median_s)
    assert speedup(4.8, 0.2) == pytest.approx(24.0)
    assert math.isnan(speedup(math.nan, 1.0))
    assert math.isnan(speedup(1.0, 0.0))


def _turn(
    conv: int, index: int, ttft: float, *, gpu: int = 0, cpu: int = 0, out: tuple[int, ...] = (1, 2)
) -> TurnResult:
    return TurnResult(
        conversation=conv,
        turn=index,
        prompt_tokens=100,
        history_tokens=80,
        ttft_s=ttft,
        gpu_hit_tokens=gpu,
        offload_hit_tokens={"CPU": cpu} if cpu else {},
        loaded_blocks=cpu // 16,
        computed_tokens=100 - gpu - cpu,
        output=out,
    )


# Two conversations x three turns; cpu is 10x faster on late turns (index >= 1).
NONE = ConfigRun(
    Configuration("none", None),
    tuple(_turn(c, i, t) for i, t in enumerate([1.0, 4.0, 6.0]) for c in (0, 1)),
)
CPU = ConfigRun(
    Configuration("cpu", {"cpu_bytes_to_use": 1 << 20}),
    tuple(_turn(c, i, t, gpu=16, cpu=64) for i, t in enumerate([1.0, 0.4, 0.6]) for c in (0, 1)),
    OffloadStats(
        hit_blocks={"CPU": 16},
        loaded_blocks=16,
        stored_blocks=30,
        bytes_loaded=3 * 2**20,
        bytes_stored=5 * 2**20,
    ),
)


def test_summaries_on_known_numbers() -> None:
    none, cpu = summarize(NONE, late_turn=1), summarize(CPU, late_turn=1)
    assert none.all_turns.median_s == 4.0
    assert none.late_turns.median_s == 5.0 and none.late_turns.count == 4
    assert cpu.late_turns.median_s == pytest.approx(0.5)
    assert cpu.late_turns.p90_s == pytest.approx(0.6)
    assert speedup(none.late_turns.median_s, cpu.late_turns.median_s) == pytest.approx(10.0)
    assert dict(none.by_turn) == {0: 1.0, 1: 4.0, 2: 6.0}
    assert cpu.prompt_tokens == 600
    assert cpu.ratio(cpu.gpu_hit_tokens) == pytest.approx(0.16)
    assert cpu.ratio(cpu.offload_hit_tokens["CPU"]) == pytest.approx(0.64)
    assert cpu.computed_tokens == 6 * 20


def test_report_prints_speedups_and_headlines() -> None:
    runs = (NONE, CPU)
    text = format_report([summarize(r, 1) for r in runs], [], 1, {0: 40, 1: 80, 2: 120})
    assert (
        "cpu: late-turn TTFT median 0.50 s vs 5.00 s recompute (10.0x), outputs identical" in text
    )
    assert "CPU 64.0%" in text
    assert "3.0 MiB" in text and "5.0 MiB" in text
    assert "ERROR" not in text


def test_report_shouts_when_outputs_differ() -> None:
    bad = [Mismatch("cpu", "none", conversation=1, turn=2, position=3)]
    text = format_report([summarize(r, 1) for r in (NONE, CPU)], bad, 1, {0: 40, 1: 80, 2: 120})
    assert "ERROR: 1 turn(s) generated different tokens" in text
    assert "conversation 1 turn 2, first difference at output token 3" in text
    assert "OUTPUTS DIFFER" in text


def test_json_is_strict_and_complete() -> None:
    runs = (NONE, CPU)
    doc = to_json(runs, [summarize(r, 1) for r in runs], [])
    json.dumps(doc, allow_nan=False)  # no NaN anywhere
    assert doc["outputs_identical"] is True
    cpu = doc["configurations"]["cpu"]
    assert cpu["late_speedup_vs_none"] == pytest.approx(10.0)
    assert cpu["ttft_late"]["median_s"] == pytest.approx(0.5)
    assert cpu["offload_totals"]["bytes_loaded"] == 3 * 2**20
    assert len(cpu["turns"]) == 6 and "output_sha256_16" in cpu["turns"][0]
    assert list(doc["configurations"]) == ["none", "cpu"]
