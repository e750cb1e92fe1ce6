"""``kvtier run`` as a command: JSON and PNG written, exit codes, option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier import cli
from kvtier.run import job
from kvtier.run.job import Mismatch

TINY_ARGS = [
    "--conversations", "3", "--turns", "3", "--system-tokens", "40",
    "--user-tokens", "10-30", "--answer-tokens", "3-6", "--block-size", "4", "--no-progress",
]  # fmt: skip


def _run(tmp_path: Path, checkpoint: Path, *extra: str) -> int:
    out = tmp_path / "out.json"
    return cli.main(["run", "--model", str(checkpoint), *TINY_ARGS, "--json", str(out), *extra])


def test_writes_json_and_png_with_the_expected_keys(
    tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, tiny_checkpoint) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["benchmark"] == "run"
    assert {"machine", "commit", "time_utc", "config", "results"} <= doc.keys()
    assert doc["config"]["workload"]["conversations"] == 3
    assert doc["config"]["gpu_blocks"] >= 1 and doc["config"]["threads"] == 1
    results = doc["results"]
    assert results["outputs_identical"] is True and results["mismatches"] == []
    configs = results["configurations"]
    assert list(configs) == ["none", "cpu", "cpu+disk"]
    none = configs["none"]
    assert none["skipped"] is None and none["offload"] is None
    for key in ("ttft_all", "ttft_late", "ttft_median_by_turn", "gpu_hit_ratio",
                "offload_hit_ratio", "offload_totals", "computed_tokens", "turns"):  # fmt: skip
        assert key in none
    assert len(none["turns"]) == 9
    assert {"ttft_s", "prompt_tokens", "gpu_hit_tokens", "offload_hit_tokens", "loaded_blocks",
            "computed_tokens", "output_sha256_16"} <= none["turns"][0].keys()  # fmt: skip
    for name in ("cpu", "cpu+disk"):
        assert configs[name]["skipped"] is not None or len(configs[name]["turns"]) == 9
    png = (tmp_path / "out.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert "none: late-turn TTFT median" in printed
    assert "too small to keep the conversations" in printed


def test_a_mismatch_is_loud_and_exits_1(
    tmp_path: Path,
    tiny_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def differ(runs):  # type: ignore[no-untyped-def]
        return (Mismatch("cpu", "none", conversation=0, turn=1, position=2),)

    monkeypatch.setattr(job, "compare_outputs", differ)
    assert _run(tmp_path, tiny_checkpoint, "--configs", "none") == 1
    assert "ERROR: 1 turn(s) generated different tokens" in capsys.readouterr().out
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["results"]["outputs_identical"] is False


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--user-tokens", "300-100"], "--user-tokens"),
        (["--answer-tokens", "many"], "--answer-tokens"),
        (["--configs", "none,gpu"], "--configs"),
        (["--turns", "0"], "--turns"),
        (["--threads", "0"], "--threads"),
        (["--late-turn", "9"], "--late-turn"),
        (["--cpu-bytes", "lots"], "--cpu-bytes"),
        (["--gpu-blocks", "3"], "--gpu-blocks"),
    ],
)
def test_bad_options_are_named(
    tmp_path: Path,
    tiny_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    option: str,
) -> None:
    assert _run(tmp_path, tiny_checkpoint, *args) == 2
    assert f"config key {option!r}" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
