"""``kvtier run --metrics-port``: scraped during the run, and its numbers match the report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtier import cli
from kvtier.engine import LLM
from kvtier.engine.stats import EngineStats
from kvtier.run import job

from .engine_run import scrape

TINY_ARGS = [
    "--conversations", "3", "--turns", "3", "--system-tokens", "40",
    "--user-tokens", "10-30", "--answer-tokens", "3-6", "--block-size", "4", "--no-progress",
    # LRU (named, though it is the default): this little run's CPU tier then sends
    # blocks to disk and loads some back, so the DISK metrics below are not all zeros
    # (``leader`` keeps them in CPU)
    "--eviction-policy", "lru",
]  # fmt: skip
TURNS = 9


def _parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_run_is_scraped_while_it_runs_and_its_last_scrape_matches_the_report(
    tmp_path: Path,
    tiny_checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    printed: list[str] = []  # what the run printed so far (the URL is among it)
    scrapes: list[dict[Any, float]] = []
    warmups: list[EngineStats] = []  # each engine's first call: counted by metrics, not reports

    class ScrapedLLM(LLM):
        """Each engine call is followed by a real HTTP scrape, as Prometheus would."""

        def generate(self, prompt_token_ids, max_new_tokens):  # type: ignore[no-untyped-def]
            out = super().generate(prompt_token_ids, max_new_tokens)
            if not getattr(self, "warmed", False):
                self.warmed = True
                assert self.last_stats is not None
                warmups.append(self.last_stats)
            printed.append(capsys.readouterr().out)
            (url,) = re.findall(r"^metrics: (http://\S+)", "".join(printed), re.MULTILINE)
            scrapes.append(scrape(url))
            return out

    monkeypatch.setattr(job, "LLM", ScrapedLLM)
    out = tmp_path / "run.json"
    argv = ["run", "--model", str(tiny_checkpoint), *TINY_ARGS, "--json", str(out),
            "--metrics-port", "0"]  # fmt: skip
    rc = cli.main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-3000:]
    assert "127.0.0.1:" in "".join(printed)  # loopback by default
    doc = json.loads(out.read_text())["results"]["configurations"]
    final = _parse(out.with_suffix(".prom").read_text())

    def value(m: dict[Any, float], name: str, **labels: str) -> float:
        return m.get((name, frozenset(labels.items())), 0.0)

    assert len(scrapes) == 3 * (TURNS + 1)  # 3 engines, 9 turns and a warm-up each
    for name, warm in zip(("none", "cpu", "cpu+disk"), warmups, strict=True):
        report = doc[name]
        w = warm.offload
        c = {"config": name}
        # Every turn shows up in the scrape that follows it.
        counts = [value(s, "kvtier_requests_total", **c) for s in scrapes]
        assert sorted(set(counts) - {0.0}) == list(range(1, TURNS + 2))
        assert value(final, "kvtier_requests_total", **c) == TURNS + 1
        prompt = report["prompt_tokens"] + warm.prompt_tokens
        assert value(final, "kvtier_prompt_tokens_total", **c) == prompt
        assert value(final, "kvtier_hit_tokens_total", tier="GPU", **c) == report["gpu_hit_tokens"]
        assert warm.gpu_hit_blocks == 0 and not w.hit_blocks  # the first call hits nothing
        for tier, tokens in report["offload_hit_tokens"].items():
            assert value(final, "kvtier_hit_tokens_total", tier=tier, **c) == tokens
        totals = report["offload_totals"]
        load = {"src": "CPU", "dst": "GPU", **c}
        store = {"src": "GPU", "dst": "CPU", **c}
        loaded = value(final, "kvtier_transfer_blocks_total", outcome="ok", **load)
        stored = value(final, "kvtier_transfer_blocks_total", outcome="ok", **store)
        assert loaded == totals["loaded_blocks"]
        assert stored == totals["stored_blocks"] + w.stored_blocks
        assert value(final, "kvtier_transfer_bytes_total", **load) == totals["bytes_loaded"]
        assert value(final, "kvtier_transfer_bytes_total", **store) == (
            totals["bytes_stored"] + w.bytes_stored
        )
        assert totals["failures"] == {}
        refused = value(final, "kvtier_refused_blocks_total", tier="CPU", op="store", **c)
        assert refused == totals["refused_stores"] + w.refused_stores
    # Offloading did work, so the equalities above are not all zeros.
    assert doc["cpu+disk"]["offload_totals"]["bytes_loaded"] > 0
    assert doc["cpu+disk"]["offload_hit_tokens"].get("DISK", 0) > 0


def test_the_report_names_failed_blocks_by_tier_operation_and_reason() -> None:
    from kvtier.blocks import Medium
    from kvtier.engine import OffloadStats
    from kvtier.observability.failures import FailureKey
    from kvtier.run.configs import Configuration
    from kvtier.run.job import ConfigRun, TurnResult
    from kvtier.run.report import format_report, summarize, to_json

    turn = TurnResult(0, 0, 100, 0, 0.5, 0, {}, 0, 100, (1,))
    a = OffloadStats(failures={FailureKey(Medium.REMOTE, "store", "unreachable"): 7})
    b = OffloadStats(
        failures={
            FailureKey(Medium.REMOTE, "store", "unreachable"): 5,
            FailureKey(Medium.DISK, "store", "full"): 2,
        }
    )
    run = ConfigRun(Configuration("cpu", {"cpu_bytes_to_use": 1}), (turn,), a + b)
    summary = summarize(run, 0)
    text = format_report([summary], (), 0, {0: 0})
    assert "cpu: FAILED blocks by tier, operation and reason: DISK store full 2, " in text
    assert "REMOTE store unreachable 12" in text
    doc = to_json([run], [summary], ())
    assert doc["configurations"]["cpu"]["offload_totals"]["failures"] == {
        "DISK store full": 2,
        "REMOTE store unreachable": 12,
    }
    json.dumps(doc)  # plain JSON
