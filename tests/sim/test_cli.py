"""``kvtier simulate`` end to end, on a small generated trace written to a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cli import main
from kvtier.sim.trace import write_mooncake
from kvtier.sim.workload import WorkloadConfig, generate


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    write_mooncake(generate(WorkloadConfig(seed=1, requests=300)), path)
    return path


def test_single_run_json(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["simulate", "--trace", str(trace_file), "--capacity", "10%", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "simulate" and doc["config"]["capacities"] == ["10%"]
    doc = doc["results"]
    for key in ("block_hit_ratio", "token_hit_ratio", "request_hit_ratio_mean"):
        assert 0.0 <= doc[key] <= 1.0
    assert doc["block_hit_ratio"] <= doc["belady_block_hit_ratio"] + 1e-12
    assert doc["tiers"][0]["medium"] == "CPU"
    assert doc["policy"] == "lru"  # the engine's default (OffloadingConfig)
    text = capsys.readouterr().out
    assert "block hits" in text and "request mean" in text and "belady" in text


def test_sweep_writes_png_and_json(trace_file: Path, tmp_path: Path) -> None:
    png, out = tmp_path / "s.png", tmp_path / "s.json"
    argv = ["simulate", "--trace", str(trace_file), "--sweep", "5%,50%", "--policy", "lru",
            "--policy", "slru", "--plot", str(png), "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = json.loads(out.read_text())["results"]["points"]
    assert [p["capacity"] for p in points] == ["5%", "50%"]
    assert [r["policy"] for r in points[0]["runs"]] == ["lru", "slru"]
    assert "belady_block_hit_ratio" in points[1]


def test_generated_and_byte_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the results go to ./kvtier-results/
    argv = ["simulate", "--generate", "2", "--capacity", "64MiB", "--kv-bytes-per-token",
            "16KiB", "--no-belady", "--policy", "arc"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "= 8 blocks" in printed
    (written,) = (tmp_path / "kvtier-results").glob("simulate-*.json")
    assert f"wrote {Path('kvtier-results') / written.name}" in printed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--capacity", "lots"], "cannot read capacity"),
        (["--capacity", "1GiB"], "--kv-bytes-per-token"),
        (["--block-size", "256"], "line 1:"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    trace_file: Path,
    extra: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--trace", str(trace_file), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_tiered_sweep_of_a_generated_agents_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    argv = ["simulate", "--generate", "3", "--shape", "agents", "--sweep", "1%",
            "--disk-capacity", "50%", "--policy", "lru", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "agents" in text and "cpu hits" in text and "disk hits" in text
    run = json.loads(out.read_text())["results"]["points"][0]["runs"][0]
    cpu, disk = run["tiers"]
    assert (cpu["medium"], disk["medium"]) == ("CPU", "DISK")
    assert cpu["hit_blocks"] + disk["hit_blocks"] == run["hit_blocks"]
    assert disk["capacity_blocks"] == run["disk_capacity_blocks"] > run["capacity_blocks"]
