"""``kvtier bench remote``: store and load GB/s of the remote tier against ``redis-benchmark``.

For each value size, ``--total`` bytes of distinct values (``values = total / size``
keys and CPU pages, at least ``--io-threads x --job-blocks``) are stored through the
CPU->remote handler (jobs of ``--job-blocks`` values, every job of a pass submitted at
once; the handler's I/O thread pipelines them over ``--io-threads`` connections) and
loaded back through the remote->CPU handler. In the same
run, against the same server, ``redis-benchmark -t set|get -d <size> -P <job-blocks>
-c <io-threads> -r <values>`` moves values of the same size over as many keys, with
the same pipeline depth and the same number of connections. ``--io-threads``
defaults to ``remote_io_threads``' default (2): the default run measures what an engine
runs with unless told otherwise.

Passes are sized by time, not bytes: a 64 MiB pass lasts 25-60 ms, and the ratio of
two such passes moved 0.46-0.83 between consecutive runs of the same code on a quiet
machine. So each operation and size is first calibrated (untimed passes of each
contender: once over the keyspace, then for a tenth of ``--seconds``), and every timed
pass then moves ``rounds x values`` values (the keyspace ``rounds`` times over; kvtier
and redis-benchmark the same number), with ``rounds`` the least that makes the fastest
contender's pass last ``--seconds`` at the calibration's rates (raised for the next
repeat when a repeat's passes came out shorter). Passes alternate
(kvtier, redis-benchmark ``-P <job-blocks>``,
redis-benchmark ``-P 1``, kvtier, ...), ``--repeats`` of each; reported: the median
GB/s (10^9 payload bytes per second) of each, their ratio, and the ratio of each
repeat's kvtier pass to the redis-benchmark passes beside it (``ratio_runs``; their
``ratio_spread`` is (max - min) / median). kvtier's pass is timed from its first job
submitted to its last finished, redis-benchmark's by its own clock (its start-up and
connecting not counted, which can only favour it).

redis-benchmark is run at ``-P <job-blocks>`` and at ``-P 1``, and the ratio is taken
against the faster: its own client slows down with deep pipelines of large values (on
one machine, 4 MiB SETs ran 4x faster at ``-P 1`` than at ``-P 8``), and a ratio
against a handicapped reference would flatter kvtier.

The same keys: kvtier stores every block under its own key, so redis-benchmark runs
over a keyspace of as many keys (``-r <values>``; before the ``GET`` passes every one
of those keys is written, so each ``GET`` finds a value as kvtier's do). Its default,
one key overwritten again and again, keeps a single value hot in the server's
allocator and caches: on a loaded machine it stores 256 KiB values 1.4-2.5x faster
than over 1,024 keys (on a quiet one, as fast). That figure is still
measured, once per operation and size after the timed passes
(``redis_benchmark_one_key_gbps``, ``ratio_one_key``); the aim is judged against the
same keyspace.

What the ratio holds: redis-benchmark sends the same constant bytes and discards what
it reads. kvtier also checksums every value (XXH3-64), adds its ~104-byte header, and
on load verifies the value in its CPU page: the ratio is the whole cost of the design.

Sealing's cost (``--sealed-sizes``, ``kvtier.bench.sealed``): in the same run, stores
and loads through a plain store and a store sealed with a random key, alternated, each
pass over the keyspace as many times as makes a plain store pass last ``--seconds``.

``redis-benchmark -d`` accepts values up to 1 GiB (it clamps larger ones), so every
size here is compared as it is. Unless ``--url`` names a server, the benchmark starts
its own ``redis-server`` on a free loopback port with no persistence and a
``maxmemory`` of three times the largest keyspace and room for a full pipeline's
replies on every connection (``server_memory``;
``allkeys-lru``), and stops it at the end. The load average before and after the run
goes into the JSON with the machine, the commit and the configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import math
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import redis
import torch

from kvtier import options
from kvtier.bench import sealed
from kvtier.bench.disk import checksum_vs_copy
from kvtier.blocks import BlockHash, BlockId
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.load_store_specs import CPULoadStoreSpec, RemoteLoadStoreSpec
from kvtier.media.remote import RemoteStore
from kvtier.media.remote_options import RemoteOptions, redacted_url
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers
from kvtier.worker.handler import OffloadingHandler

DEFAULT_IO_THREADS = OffloadingConfig(cpu_bytes_to_use=1).remote_io_threads
"""``--io-threads`` unless given: what an engine runs with ``remote_io_threads`` unset, so
the default run measures the configuration a user gets."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench remote`` (each checked before anything is measured)."""
    parser.add_argument(
        "--url",
        default=None,
        help="redis:// URL of a server to test (default: start a local redis-server)",
    )
    parser.add_argument(
        "--sizes",
        type=options.size_list,
        default="256KiB,1MiB,4MiB",
        help="value sizes, comma separated",
    )
    parser.add_argument(
        "--total",
        type=options.size,
        default="64MiB",
        help="bytes of distinct values (keys and CPU pages) per value size",
    )
    parser.add_argument(
        "--seconds",
        type=_seconds,
        default=0.5,
        help="least duration of each timed pass (passes go over the keys that many times)",
    )
    parser.add_argument(
        "--repeats", type=options.positive, default=5, help="timed passes of each contender"
    )
    parser.add_argument(
        "--io-threads",
        type=options.positive,
        default=DEFAULT_IO_THREADS,
        help="connections per direction (default: remote_io_threads' default)",
    )
    parser.add_argument(
        "--job-blocks", type=options.positive, default=8, help="values per job (pipeline depth)"
    )
    parser.add_argument(
        "--sealed-sizes",
        type=options.size_list,
        default=sealed.DEFAULT_SIZES,
        help="value sizes whose stores and loads also run sealed (AES-256-GCM) beside plain ones",
    )
    add_json_option(parser, "remote")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 60 s, got {text!r}")
    return value


def check_server(url: str) -> None:
    """Refuse a URL that is not a Redis URL or whose server does not answer a PING.

    Raises:
        ConfigError: (key ``--url``) saying what was tried and what to change.
    """
    shown = redacted_url(url)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("--url", f"must be a redis://, rediss:// or unix:// URL, got {shown!r}")
    if urlsplit(url).netloc.count("@"):
        # redis-benchmark takes a password only on its command line, where every user
        # of the machine can read it
        raise ConfigError("--url", f"holds credentials; benchmark a server without them ({shown})")
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5) as client:
            client.ping()
    except (redis.RedisError, OSError, ValueError) as e:
        raise ConfigError(
            "--url", f"no Redis answers at {shown} ({e}); start one, or leave --url out"
        ) from None


@contextlib.contextmanager
def local_server(maxmemory: int) -> Iterator[str]:
    """A throw-away ``redis-server`` on a free loopback port; yields its URL."""
    if shutil.which("redis-server") is None:
        raise ConfigError(
            "--url", "redis-server is not on PATH: install it (apt-get install redis-server)"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="kvtier-bench-redis-")
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", workdir, "--maxmemory", str(maxmemory)]
    cmd += ["--maxmemory-policy", "allkeys-lru"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        with redis.Redis(port=port) as client:
            for _ in range(500):
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    break
                time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def redis_benchmark(
    url: str, test: str, size: int, values: int, keys: int | None, pipeline: int, clients: int
) -> float:
    """One ``redis-benchmark -t <test>`` pass of ``values`` values; payload bytes per
    second by its own clock (its start-up and connecting not counted).

    ``keys``: over that many keys (``-r keys``; fill them with ``fill_keyspace`` before
    a ``get`` pass); ``None``: redis-benchmark's one key. Its clock counts whole
    milliseconds: a pass that took less reports ``inf`` requests per second, and is
    run again with twice the values until it reports a rate.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    for _ in range(30):
        cmd = ["redis-benchmark", "-h", host, "-p", str(port), "-d", str(size), "-t", test]
        cmd += ["-P", str(pipeline), "-c", str(clients), "-n", str(values), "--csv"]
        if keys is not None:
            cmd += ["-r", str(keys)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        (row,) = csv.DictReader(io.StringIO(out.stdout))
        rps = float(row["rps"])
        if math.isfinite(rps) and rps > 0:
            return rps * size
        values *= 2
    raise RuntimeError(f"redis-benchmark reported no rate: {out.stdout!r}")


def fill_keyspace(url: str, size: int, count: int) -> None:
    """Write every key redis-benchmark's ``-r count`` can name (``key:%012d``)."""
    value = bytes(size)
    with redis.Redis.from_url(url, socket_timeout=60) as client:
        for start in range(0, count, 16):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + 16, count)):
                pipe.set(f"key:{i:012d}", value)
            pipe.execute()


class _Pass:
    """Stores or loads the keyspace ``rounds`` times through one handler, in jobs of
    ``job_blocks`` values, and waits for the last."""

    def __init__(self, handler: OffloadingHandler, keys: list[BlockHash], job_blocks: int) -> None:
        self.handler, self.keys, self.job_blocks = handler, keys, job_blocks
        self.job = 0

    def run(self, store: bool, rounds: int = 1) -> None:
        jobs = []
        for _ in range(rounds):
            for start in range(0, len(self.keys), self.job_blocks):
                ids = tuple(
                    BlockId(i) for i in range(start, min(start + self.job_blocks, len(self.keys)))
                )
                cpu = CPULoadStoreSpec(ids)
                remote = RemoteLoadStoreSpec(ids, tuple(self.keys[i] for i in ids))
                self.job += 1
                self.handler.transfer_async(self.job, (cpu, remote) if store else (remote, cpu))
                jobs.append(self.job)
        self.handler.wait(jobs)
        failed = [r for r in self.handler.get_finished() if not r.success]
        if failed:
            raise RuntimeError(f"{len(failed)} jobs failed, first: {failed[0].error}")


def timed(run: Callable[[], object]) -> float:
    """Seconds ``run()`` took."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def rounds_for(seconds: float, keyspace_bytes: int, rates: list[float]) -> int:
    """Passes over the keyspace that make one timed pass of the fastest of ``rates``
    (bytes per second) last at least ``seconds``."""
    return max(1, math.ceil(seconds * max(rates) / keyspace_bytes))


def measure_op(
    url: str, op: str, kvtier: _Pass, size: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One operation (``store`` or ``load``) at one value size: calibrated, then
    ``args.repeats`` alternating passes of kvtier and redis-benchmark at both depths."""
    store = op == "store"
    test = "set" if store else "get"
    count, clients, depth = len(kvtier.keys), args.io_threads, args.job_blocks
    keyspace = count * size

    def rb(values: int, pipeline: int, keys: int | None = count) -> float:
        return redis_benchmark(url, test, size, values, keys, pipeline, clients)

    # calibration, untimed (also the warm-up): one pass of each over the keyspace,
    # then passes of a tenth of the time asked, whose rates decide the rounds (one
    # short pass underrates the contenders, and the timed passes came out too short)
    rounds = 1
    for seconds in (args.seconds / 10, args.seconds):
        values = rounds * count
        rates = [
            rounds * keyspace / timed(lambda: kvtier.run(store, rounds)),  # noqa: B023
            rb(values, depth),
            rb(values, 1),
        ]
        rounds = rounds_for(seconds, keyspace, rates)
    kv, deep, single, rounds_runs, shortest = [], [], [], [], []
    for _ in range(args.repeats):
        values, nbytes = rounds * count, rounds * keyspace
        kv.append(nbytes / timed(lambda: kvtier.run(store, rounds)))  # noqa: B023
        deep.append(rb(values, depth))
        single.append(rb(values, 1))
        rounds_runs.append(rounds)
        shortest.append(nbytes / max(kv[-1], deep[-1], single[-1]))
        # calibration still underrates the steady rates: the next repeat's passes (all
        # three the same number of values) are made long enough at this repeat's
        rounds = max(rounds, rounds_for(args.seconds, keyspace, [kv[-1], deep[-1], single[-1]]))
    one_key = max(rb(values, depth, None), rb(values, 1, None))
    pairs = [k / max(d, s) for k, d, s in zip(kv, deep, single, strict=True)]
    kv_med, deep_med, single_med = (statistics.median(x) for x in (kv, deep, single))
    ref = max(deep_med, single_med)
    ratio_med = statistics.median(pairs)
    return {
        "op": op,
        "value_bytes": size,
        "values": count,
        "rounds_runs": rounds_runs,
        "shortest_pass_s_runs": [round(x, 3) for x in shortest],
        "kvtier_gbps": round(kv_med / 1e9, 3),
        "redis_benchmark_gbps": round(ref / 1e9, 3),
        "ratio": round(kv_med / ref, 3),
        "ratio_runs": [round(r, 3) for r in pairs],
        "ratio_spread": round((max(pairs) - min(pairs)) / ratio_med, 3),
        "redis_benchmark_test": test.upper(),
        "kvtier_gbps_runs": [round(x / 1e9, 3) for x in kv],
        "redis_benchmark_pipelined_gbps": round(deep_med / 1e9, 3),
        "redis_benchmark_pipelined_gbps_runs": [round(x / 1e9, 3) for x in deep],
        "redis_benchmark_p1_gbps": round(single_med / 1e9, 3),
        "redis_benchmark_p1_gbps_runs": [round(x / 1e9, 3) for x in single],
        "redis_benchmark_keys": count,
        "redis_benchmark_one_key_gbps": round(one_key / 1e9, 3),
        "ratio_one_key": round(kv_med / one_key, 3),
    }


def keyspace_values(size: int, total: int, args: argparse.Namespace) -> int:
    """Distinct values (keys, CPU pages) at one size: ``total / size``, and at least
    one job per thread in flight."""
    return max(int(args.job_blocks) * int(args.io_threads), total // size)


def server_memory(sizes: list[int], total: int, args: argparse.Namespace) -> int:
    """``maxmemory`` of the benchmark's own server: three times the largest keyspace
    (kvtier's keys, redis-benchmark's, room to spare), and the replies a full pipeline
    of the largest values holds on every connection of both (Redis counts its clients'
    output buffers as used memory): without that room the server evicts values in the
    middle of a pass and a timed load misses. Each size's evicted keys are recorded
    (``server_evicted_keys``)."""
    largest = max(keyspace_values(s, total, args) * s for s in sizes)
    in_flight = 2 * int(args.io_threads) * int(args.job_blocks) * max(sizes)
    return 3 * largest + in_flight + (64 << 20)


def measure_size(url: str, size: int, total: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Store and load, kvtier and redis-benchmark, for one value size."""
    count = keyspace_values(size, total, args)
    rng = np.random.default_rng(size)
    pages = torch.from_numpy(rng.integers(0, 256, (count, size), dtype=np.uint8))
    fingerprint = size.to_bytes(8, "big") * 4
    options = RemoteOptions(url=url, max_connections=2 * args.io_threads + 2, timeout_s=30.0)
    store = RemoteStore.open(fingerprint, options)
    handlers = CpuRemoteOffloadingHandlers(pages, store, io_threads=args.io_threads)
    keys = [BlockHash(i.to_bytes(32, "big")) for i in range(count)]
    with redis.Redis.from_url(url) as client:
        evicted_before = int(client.info("stats")["evicted_keys"])
    try:
        stored = measure_op(
            url, "store", _Pass(handlers.cpu_to_remote_handler, keys, args.job_blocks), size, args
        )
        fill_keyspace(url, size, count)  # every GET of redis-benchmark finds its value
        loaded = measure_op(
            url, "load", _Pass(handlers.remote_to_cpu_handler, keys, args.job_blocks), size, args
        )
    finally:
        handlers.shutdown()
    store.delete_many(keys)
    store.close()
    with redis.Redis.from_url(url) as client:  # room for the next size's keys
        client.delete(*(f"key:{i:012d}" for i in range(count)), "key:__rand_int__")
        evicted = int(client.info("stats")["evicted_keys"]) - evicted_before
    return [{**row, "server_evicted_keys": evicted} for row in (stored, loaded)]


def measure_sealed(url: str, size: int, total: int, args: Any) -> list[dict[str, Any]]:
    """Stores and loads of one value size, plain and sealed, side by side."""
    count = keyspace_values(size, total, args)
    rng = np.random.default_rng(size + 1)
    pages = torch.from_numpy(rng.integers(0, 256, (count, size), dtype=np.uint8))
    options = RemoteOptions(url=url, max_connections=2 * args.io_threads + 2, timeout_s=30.0)
    keys = [BlockHash(i.to_bytes(32, "big")) for i in range(count)]
    stores = [RemoteStore.open(bytes([0x5E, n]) * 16, options, keys=k)
              for n, k in enumerate(((), sealed.bench_keys()))]  # fmt: skip
    pairs = [CpuRemoteOffloadingHandlers(pages, s, io_threads=args.io_threads) for s in stores]
    store_passes = [_Pass(h.cpu_to_remote_handler, keys, args.job_blocks) for h in pairs]
    load_passes = [_Pass(h.remote_to_cpu_handler, keys, args.job_blocks) for h in pairs]
    try:
        seconds = timed(lambda: store_passes[0].run(True))  # untimed calibration
        rounds = rounds_for(args.seconds, count * size, [count * size / seconds])
        rows = [
            sealed.side_by_side(
                sealed.Passes(
                    op,
                    size,
                    rounds * count * size,
                    functools.partial(ps[0].run, op == "store", rounds),
                    functools.partial(ps[1].run, op == "store", rounds),
                ),
                args.repeats,
            )
            for op, ps in (("store", store_passes), ("load", load_passes))
        ]
    finally:
        for handlers in pairs:
            handlers.shutdown()
    for store in stores:
        store.delete_many(keys)
        store.close()
    return [{**r, "values": count, "rounds": rounds} for r in rows]


def main(args: argparse.Namespace) -> int:
    """Measure, print a table and one summary line, write the JSON.

    Raises:
        ConfigError: a bad option (named), found before anything is measured.
    """
    sizes, total = args.sizes, args.total
    if shutil.which("redis-benchmark") is None:
        raise ConfigError(
            "--url", "redis-benchmark is not on PATH: install it (apt-get install redis-tools)"
        )
    if args.url is not None:
        check_server(args.url)
    out = check_output("--json", args.json or default_path("remote"))
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(local_server(server_memory(sizes, total, args)))
        rows = [r for s in sizes for r in measure_size(url, s, total, args)]
        sealed_rows = [r for s in args.sealed_sizes for r in measure_sealed(url, s, total, args)]
    load_after = os.getloadavg()
    print(
        f"{'op':6} {'value':>8} {'kvtier':>8} {'rb -P N':>8} {'rb -P 1':>8} {'ratio':>6}"
        f" {'runs':>11} {'rb 1 key':>9} {'ratio':>6}"
        "  (GB/s, medians; ratio runs min-max; rb over the same keys, then over one key)"
    )
    for r in rows:
        print(
            f"{r['op']:6} {r['value_bytes'] // 1024:>6}Ki {r['kvtier_gbps']:>8.3f} "
            f"{r['redis_benchmark_pipelined_gbps']:>8.3f} {r['redis_benchmark_p1_gbps']:>8.3f} "
            f"{r['ratio']:>6.2f} {min(r['ratio_runs']):>5.2f}-{max(r['ratio_runs']):<5.2f} "
            f"{r['redis_benchmark_one_key_gbps']:>9.3f} {r['ratio_one_key']:>6.2f}"
        )
    sealed.print_rows(sealed_rows)
    config = {
        "url": redacted_url(args.url)
        if args.url
        else "local redis-server (started by the benchmark)",
        "redis_server": _server_version(),
        "sizes": sizes,
        "total_bytes_per_size": total,
        "seconds_per_pass": args.seconds,
        "repeats": args.repeats,
        "io_threads": args.io_threads,
        "job_blocks": args.job_blocks,
        "sealed_sizes": args.sealed_sizes,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "checksum": checksum_vs_copy(sizes),
    }
    path = write_result("remote", config, rows + sealed_rows, out)
    worst = min(rows, key=lambda r: r["ratio"])
    print(
        f"remote: worst ratio to redis-benchmark {worst['ratio']:.2f} ({worst['op']} "
        f"{worst['value_bytes'] // 1024} KiB); {sealed.summary(sealed_rows)}; load average "
        f"{load_before[0]:.2f} -> {load_after[0]:.2f}; wrote {path}"
    )
    return 0


def _server_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip()
