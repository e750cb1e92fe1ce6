"""``kvtier bench remote`` runs end to end on a tiny configuration (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.bench.remote import redis_benchmark
from kvtier.cli import main

from ..redis_server import RedisServer, require_redis


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
    # the reference ran over as many keys as kvtier wrote, and over one key beside it
    assert [r["redis_benchmark_keys"] for r in doc["results"]] == [16, 16]
    for r in doc["results"]:
        assert r["redis_benchmark_one_key_gbps"] > 0
        one_key = r["kvtier_gbps"] / r["redis_benchmark_one_key_gbps"]
        assert abs(r["ratio_one_key"] - one_key) <= 0.002 + 0.01 * one_key  # (both rounded)


def test_the_reference_runs_over_the_keys_kvtier_writes(tmp_path: Path) -> None:
    """redis-benchmark's ``-r`` keyspace is filled before its GET pass: every GET hits."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        rates = redis_benchmark(server.url, 4096, 64, 4, 2, keyspace=True)
        assert set(rates) == {"set", "get"} and min(rates.values()) > 0
        client = server.client()
        stats = client.info("stats")
        # 64 keys written (the fill names exactly redis-benchmark's keys), no GET missed
        assert client.dbsize() == 64
        assert sorted(client.keys("key:*")) == [b"key:%012d" % i for i in range(64)]
        assert stats["keyspace_misses"] == 0 and stats["keyspace_hits"] == 64
        client.flushall()
        redis_benchmark(server.url, 4096, 64, 4, 2, keyspace=False)
        assert client.keys("*") == [b"key:__rand_int__"]  # its default: one key
    finally:
        server.stop()
