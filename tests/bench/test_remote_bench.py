"""``kvtier bench remote`` runs end to end on a tiny configuration (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.cli import main

from ..redis_server import require_redis


def test_bench_remote_writes_its_json(tmp_path: Path) -> None:
    require_redis()
    out = tmp_path / "remote.json"
    args = ["bench", "remote", "--sizes", "64KiB", "--total", "1MiB", "--repeats", "1"]
    assert main([*args, "--job-blocks", "4", "--io-threads", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "remote"
    assert [(r["op"], r["value_bytes"]) for r in doc["results"]] == [
        ("store", 65536),
        ("load", 65536),
    ]
    assert all(r["kvtier_gbps"] > 0 and r["redis_benchmark_gbps"] > 0 for r in doc["results"])
