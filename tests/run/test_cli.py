"""``kvtier run`` as a command: JSON and PNG written, exit codes, option errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtier import cli
from kvtier.engine import LLM, NoOpConnector
from kvtier.run import job
from tests.tiny import TINY

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
    assert none["offload"] is None
    for key in ("ttft_all", "ttft_late", "ttft_median_by_turn", "gpu_hit_ratio",
                "offload_hit_ratio", "offload_totals", "computed_tokens", "turns"):  # fmt: skip
        assert key in none
    assert len(none["turns"]) == 9
    assert {"ttft_s", "prompt_tokens", "gpu_hit_tokens", "offload_hit_tokens", "loaded_blocks",
            "computed_tokens", "output_sha256_16"} <= none["turns"][0].keys()  # fmt: skip
    for name in ("cpu", "cpu+disk"):
        assert len(configs[name]["turns"]) == 9
        assert configs[name]["offload"]["cpu_bytes_to_use"] > 0
        assert configs[name]["offload_totals"]["bytes_stored"] > 0
    assert "disk_path" in configs["cpu+disk"]["offload"]
    png = (tmp_path / "out.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == "kvtier run: loading torch and the model ..."
    assert re.search(r"config cpu: cpu_bytes_to_use=\d+\.\d [KM]iB, block_size=4,", printed)
    assert "none: late-turn TTFT median" in printed
    assert "too small to keep the conversations" in printed


class _TamperedLLM(LLM):
    """An engine that changes the last token of every answer when offloading is on."""

    def generate(self, prompt_token_ids, max_new_tokens):  # type: ignore[no-untyped-def]
        outputs = super().generate(prompt_token_ids, max_new_tokens)
        if not isinstance(self.connector, NoOpConnector):
            for out in outputs:
                out[-1] = (out[-1] + 1) % TINY.vocab_size
        return outputs


def test_a_mismatch_is_loud_and_exits_1(
    tmp_path: Path,
    tiny_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(job, "LLM", _TamperedLLM)
    assert _run(tmp_path, tiny_checkpoint, "--configs", "none,cpu") == 1
    printed = capsys.readouterr().out
    assert "ERROR: 9 turn(s) generated different tokens" in printed
    assert "cpu vs none: conversation 0 turn 0, first difference at output token" in printed
    assert "OUTPUTS DIFFER" in printed
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["results"]["outputs_identical"] is False
    assert doc["results"]["mismatches"][0]["config"] == "cpu"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--user-tokens", "300-100"], "--user-tokens"),
        (["--answer-tokens", "many"], "--answer-tokens"),
        (["--configs", "none,gpu"], "--configs"),
        (["--turns", "0"], "--turns"),
        (["--late-turn", "9"], "--late-turn"),
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
