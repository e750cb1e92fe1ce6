"""The transfer benchmark runs end to end on a tiny grid (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from kvtier.bench.transfer import _gather, _one_thread, run_transfer_bench
from kvtier.cli import main
from kvtier.errors import ConfigError


def test_results_dict_has_machine_config_and_cases() -> None:
    res = run_transfer_bench([8192], [1, 4], layers=1, ids=["random"], repeats=1, device="cpu")
    assert res["benchmark"] == "transfer"
    assert {"platform", "cpu_count", "torch", "device", "torch_threads"} <= set(res["machine"])
    assert res["commit"]
    assert [(c["blocks"], c["job_bytes"]) for c in res["cases"]] == [(1, 16384), (4, 65536)]
    case = res["cases"][0]
    assert set(case["gbps"]) == {"plain", "plain1", "gather", "g2c", "c2g", "both"}
    assert set(case["ratio_gather"]) == set(case["ratio_plain1"]) == {"g2c", "c2g", "both"}
    assert set(res["summary"]) == {"8KiB"}
    assert set(res["summary"]["8KiB"]) == {"wall", "lane", "ratio_plain1", "ratio_gather"}


def test_gather_reference_copies_the_rows_of_every_fragment() -> None:
    gen = torch.Generator().manual_seed(3)
    frags = [torch.randint(0, 256, (6, 64), dtype=torch.uint8, generator=gen) for _ in range(3)]
    rows = [4, 0, 5]
    out = torch.zeros(3 * len(rows) * 64, dtype=torch.uint8)
    _gather(frags, rows, out)()
    want = torch.cat([f[rows] for f in frags]).reshape(-1)
    assert torch.equal(out, want)


def test_one_thread_restores_torch_threads() -> None:
    threads, seen = torch.get_num_threads(), []
    _one_thread(lambda: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == threads


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
