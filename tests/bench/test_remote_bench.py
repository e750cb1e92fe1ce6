"""``kvtier bench remote`` runs end to end on a tiny configuration (no timing asserted)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from kvtier.bench import remote as remote_bench
from kvtier.bench.remote import fill_keyspace, redis_benchmark, rounds_for
from kvtier.cli import main
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError

from ..redis_server import RedisServer, require_redis
from .rounded import assert_rounded_quotient, assert_sealed_rows


def test_bench_remote_writes_its_json(tmp_path: Path) -> None:
    require_redis()
    out = tmp_path / "remote.json"
    args = ["bench", "remote", "--sizes", "64KiB", "--total", "1MiB", "--repeats", "3"]
    args += ["--seconds", "0.02", "--job-blocks", "4", "--io-threads", "2", "--json", str(out)]
    assert main([*args, "--sealed-sizes", "64KiB"]) == 0
    doc = json.loads(out.read_text())
    sealed = [r for r in doc["results"] if r.get("compare") == "sealed/plain"]
    doc["results"] = [r for r in doc["results"] if r not in sealed]
    assert doc["config"]["sealed_sizes"] == [65536]
    assert_sealed_rows(sealed, 65536, repeats=3)
    assert doc["benchmark"] == "remote"
    assert doc["config"]["seconds_per_pass"] == 0.02
    assert len(doc["config"]["load_average_before"]) == 3
    assert [(r["op"], r["value_bytes"]) for r in doc["results"]] == [
        ("store", 65536),
        ("load", 65536),
    ]
    for r in doc["results"]:
        assert r["kvtier_gbps"] > 0 and r["redis_benchmark_gbps"] > 0
        # the reference ran over as many keys as kvtier wrote, and over one key beside it
        assert r["redis_benchmark_keys"] == r["values"] == 16
        assert len(r["rounds_runs"]) == len(r["shortest_pass_s_runs"]) == 3
        assert r["rounds_runs"] == sorted(r["rounds_runs"]) and r["rounds_runs"][0] >= 1
        # one ratio per repeat, each kvtier pass against the references beside it
        runs = zip(
            r["kvtier_gbps_runs"],
            r["redis_benchmark_pipelined_gbps_runs"],
            r["redis_benchmark_p1_gbps_runs"],
            strict=True,
        )
        assert len(r["ratio_runs"]) == 3
        for got, (k, d, s) in zip(r["ratio_runs"], runs, strict=True):
            assert_rounded_quotient(got, k, max(d, s))
        ratios = sorted(r["ratio_runs"])
        assert_rounded_quotient(r["ratio_spread"], ratios[2] - ratios[0], ratios[1], top_error=2)
        assert r["redis_benchmark_one_key_gbps"] > 0
        assert_rounded_quotient(
            r["ratio_one_key"], r["kvtier_gbps"], r["redis_benchmark_one_key_gbps"]
        )


def test_rounds_make_the_fastest_pass_last_the_time_asked() -> None:
    # 1 GB/s fastest over a 10 MB keyspace: 0.5 s is 50 passes over it
    assert rounds_for(0.5, 10_000_000, [0.2e9, 1e9, 0.5e9]) == 50
    assert rounds_for(0.5, 10_000_000, [1.01e9]) == 51  # never shorter than asked
    assert rounds_for(0.001, 10_000_000, [1e9]) == 1  # at least once over the keys


def test_the_reference_runs_over_the_keys_kvtier_writes(tmp_path: Path) -> None:
    """redis-benchmark's ``-r`` keyspace is filled before its GET pass: every GET hits."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        assert redis_benchmark(server.url, "set", 4096, 128, 64, 4, 2) > 0
        fill_keyspace(server.url, 4096, 64)
        assert redis_benchmark(server.url, "get", 4096, 128, 64, 4, 2) > 0
        client = server.client()
        stats = client.info("stats")
        # 64 keys written (the fill names exactly redis-benchmark's keys), no GET missed.
        # A pass of under a millisecond reports no rate and is run again with twice the
        # values, so the GETs are 128, 128 + 256, ...: 128 * (2**r - 1) for r passes.
        assert client.dbsize() == 64
        assert sorted(client.keys("key:*")) == [b"key:%012d" % i for i in range(64)]
        assert stats["keyspace_misses"] == 0
        assert stats["keyspace_hits"] in {128 * (2**passes - 1) for passes in range(1, 31)}
        client.flushall()
        redis_benchmark(server.url, "set", 4096, 64, None, 4, 2)
        assert client.keys("*") == [b"key:__rand_int__"]  # its default: one key
    finally:
        server.stop()


def test_a_reference_pass_too_short_for_its_clock_is_run_again_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-benchmark counts whole milliseconds: a pass under one reports ``inf``
    requests per second (a default run failed on it). Such a pass is run again with
    twice the values until it reports a rate, which is returned as bytes per second."""
    asked: list[int] = []
    answers = iter(["inf", "inf", "2500.00"])

    def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        asked.append(int(cmd[cmd.index("-n") + 1]))
        out = f'"test","rps","avg_latency_ms"\n"GET","{next(answers)}","0.1"\n'
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(remote_bench.subprocess, "run", run)
    rate = redis_benchmark("redis://127.0.0.1:1/0", "get", 1000, 16, 16, 4, 2)
    assert rate == 2500.0 * 1000 and asked == [16, 32, 64]


def test_the_default_run_measures_the_io_threads_an_engine_gets_by_default() -> None:
    """Without ``--io-threads`` the benchmark runs as many jobs (and redis-benchmark as
    many connections) as a configuration that leaves ``remote_io_threads`` unset."""
    parser = argparse.ArgumentParser()
    remote_bench.add_arguments(parser)
    engine = OffloadingConfig.from_dict({"cpu_bytes_to_use": "1GiB", "remote_url": "redis://h"})
    assert parser.parse_args([]).io_threads == engine.remote_io_threads
    assert parser.parse_args(["--io-threads", "4"]).io_threads == 4


def test_a_url_with_credentials_is_refused_without_showing_them() -> None:
    """redis-benchmark would need the password on its command line, where every user
    of the machine can read it: such a URL is refused, and the refusal shows no
    password."""
    with pytest.raises(ConfigError) as e:
        remote_bench.check_server("redis://alice:pw-83f1@127.0.0.1:1/0")
    assert e.value.key == "--url" and "pw-83f1" not in str(e.value) and "alice" not in str(e.value)
