"""The transfer benchmark runs end to end on a tiny grid (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from kvtier.bench.transfer import run_transfer_bench
from kvtier.cli import main
from kvtier.errors import ConfigError


def test_results_dict_has_machine_config_and_cases() -> None:
    res = run_transfer_bench([8192], [1, 4], layers=1, ids=["random"], repeats=1, device="cpu")
    assert res["benchmark"] == "transfer"
    assert {"platform", "cpu_count", "torch", "device", "torch_threads"} <= set(res["machine"])
    assert res["commit"]
    assert [(c["blocks"], c["job_bytes"]) for c in res["cases"]] == [(1, 16384), (4, 65536)]
    case = res["cases"][0]
    assert set(case["gbps"]) == {"plain", "g2c", "c2g", "both"}
    assert set(res["summary"]) == {"8KiB"}


def test_too_large_jobs_are_skipped() -> None:
    res = run_transfer_bench(
        [8192],
        [1, 64],
        layers=1,
        ids=["contiguous"],
        max_job_bytes=100_000,
        repeats=1,
        device="cpu",
    )
    assert res["skipped"] == [{"page_bytes": 8192, "blocks": 64}]


def test_rejects_odd_page_size() -> None:
    with pytest.raises(ConfigError, match="multiples of 32"):
        run_transfer_bench([1000], [1], device="cpu")


def test_cli_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    argv = ["bench", "transfer", "--pages", "8KiB", "--blocks", "2", "--layers", "1"]
    argv += ["--repeats", "1", "--ids", "random", "--device", "cpu", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "transfer" and doc["config"]["blocks"] == [2]
    assert [c["page_bytes"] for c in doc["results"]["cases"]] == [8192]
    assert "ratio to plain copy" in capsys.readouterr().out.splitlines()[-1]
