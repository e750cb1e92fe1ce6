"""Engine step time with a hung Redis (SIGSTOPped ``redis-server``) vs. no offloading.

A shared tier's ``lookup`` runs its existence checks off the scheduler thread, so a
server that answers nothing must not stretch an engine step. This serves the same
seeded requests (fresh prompts, so every admission asks Redis) through three engines
side by side, round after round: no offloading; a remote tier on a healthy
``redis-server``; and the same with the server SIGSTOPped for its rounds. A *step* is
one ``schedule`` + forward + ``update`` of the engine loop (steps where every request
waits are not steps; their cost shows in TTFT). Then ``--fresh`` times, alternated,
fresh engines serve one request each -- without offloading, with the CPU tier alone,
with the remote tier, and with the remote tier built while the server is SIGSTOPped:
their first call (``generate`` of that request) and their construction (which, with
the remote tier, includes the store's first contact: one ``remote_timeout_s`` with
the server hung).
Medians and tails per engine, and ratios against no offloading, go to one summary
line and a JSON file. Run from the repository root (needs ``redis-server`` on PATH)::

    PYTHONPATH=src python benchmarks/hung_redis.py --out benchmarks/results/hung-redis.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import torch

from kvtier.bench.report import git_commit, machine_info
from kvtier.engine import LLM, ModelSize, build_model

MODEL = ModelSize(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=1024,
)
PAGE = 4


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", str(workdir), "--maxmemory", "256mb"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    with redis.Redis(port=port, socket_timeout=1.0) as client:
        while True:
            try:
                client.ping()
                return proc, port
            except redis.RedisError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise
                time.sleep(0.02)


class StepClock:
    """Times each engine step: from ``schedule`` to the end of ``update``."""

    def __init__(self, llm: LLM) -> None:
        self.steps: list[float] = []
        self._start = 0.0
        schedule, update = llm.scheduler.schedule, llm.scheduler.update

        def timed_schedule() -> Any:
            self._start = time.perf_counter()
            return schedule()

        def timed_update(*args: Any) -> None:
            update(*args)
            self.steps.append(time.perf_counter() - self._start)

        llm.scheduler.schedule = timed_schedule  # type: ignore[method-assign]
        llm.scheduler.update = timed_update  # type: ignore[method-assign]


def summary(steps: list[float], ttfts: list[float]) -> dict[str, float | int]:
    ordered = sorted(steps)
    return {
        "steps": len(steps),
        "step_median_ms": 1e3 * statistics.median(ordered),
        "step_p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
        "step_p99_ms": 1e3 * ordered[int(0.99 * (len(ordered) - 1))],
        "step_max_ms": 1e3 * ordered[-1],
        "ttft_median_ms": 1e3 * statistics.median(ttfts),
        "ttft_max_ms": 1e3 * max(ttfts),
    }


def first_calls(
    model: Any,
    remote: dict[str, Any],
    server: subprocess.Popen[bytes],
    rng: random.Random,
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """Fresh engines, alternated: without offloading, with the CPU tier alone, with the
    remote tier too, and with it built (and served) while the server is SIGSTOPped; the
    first call and the construction of each."""
    cpu_only = {k: v for k, v in remote.items() if not k.startswith("remote_")}
    kinds = {"none": None, "cpu": cpu_only, "redis": remote, "redis_sigstop": remote}
    times: dict[str, dict[str, list[float]]] = {
        name: {"first_call": [], "build": []} for name in kinds
    }
    for _ in range(args.fresh):
        prompt = [rng.randrange(512) for _ in range(args.prompt_tokens)]
        for name, offload in kinds.items():
            if name == "redis_sigstop":
                server.send_signal(signal.SIGSTOP)
            try:
                t0 = time.perf_counter()
                llm = LLM(model=model, num_gpu_blocks=256, block_size=PAGE, offload=offload)
                t1 = time.perf_counter()
                llm.generate([prompt], args.new_tokens)
                t2 = time.perf_counter()
                llm.close()
            finally:
                server.send_signal(signal.SIGCONT)
            times[name]["build"].append(t1 - t0)
            times[name]["first_call"].append(t2 - t1)
    return {
        name: {
            "first_call_median_ms": 1e3 * statistics.median(t["first_call"]),
            "first_call_max_ms": 1e3 * max(t["first_call"]),
            "build_median_ms": 1e3 * statistics.median(t["build"]),
            "first_call_ms_runs": [round(1e3 * x, 2) for x in t["first_call"]],
        }
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=6, help="per engine per round")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=1.0, help="remote_timeout_s")
    parser.add_argument("--fresh", type=int, default=8, help="fresh engines of each kind")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(MODEL, seed=0, device="cpu")
    rng = random.Random(0)
    workdir = Path(tempfile.mkdtemp(prefix="kvtier-hung-redis-"))
    server, port = start_redis(workdir)
    remote = {
        "cpu_bytes_to_use": "16MiB",
        "block_size": PAGE,
        "remote_url": f"redis://127.0.0.1:{port}/0",
        "remote_timeout_s": args.timeout_s,
    }
    engines = {
        "none": LLM(model=model, num_gpu_blocks=256, block_size=PAGE),
        "redis": LLM(model=model, num_gpu_blocks=256, block_size=PAGE, offload=remote),
        "redis_sigstop": LLM(model=model, num_gpu_blocks=256, block_size=PAGE, offload=remote),
    }
    clocks = {name: StepClock(llm) for name, llm in engines.items()}
    ttfts: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {name: [] for name in engines}
    for name, llm in engines.items():  # warm-up: one request each, untimed
        llm.generate([[rng.randrange(512) for _ in range(args.prompt_tokens)]], 2)
        clocks[name].steps.clear()
    try:
        for _ in range(args.rounds):
            prompts = [
                [rng.randrange(512) for _ in range(args.prompt_tokens)]
                for _ in range(args.requests)
            ]
            for name, llm in engines.items():
                if name == "redis_sigstop":
                    server.send_signal(signal.SIGSTOP)
                try:
                    for p in prompts:
                        outputs[name] += llm.generate([p], args.new_tokens)
                        assert llm.last_stats is not None
                        ttfts[name] += [r.ttft_s for r in llm.last_stats.requests]
                finally:
                    server.send_signal(signal.SIGCONT)
        fresh = first_calls(model, remote, server, rng, args)
    finally:
        server.send_signal(signal.SIGCONT)
        for llm in engines.values():
            llm.close()
        server.terminate()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    same = outputs["none"] == outputs["redis"] == outputs["redis_sigstop"]
    results = {name: summary(clocks[name].steps, ttfts[name]) for name in engines}
    base = results["none"]["step_median_ms"]
    for name in engines:
        results[name]["step_median_vs_none"] = results[name]["step_median_ms"] / base
        results[name]["step_median_minus_none_ms"] = results[name]["step_median_ms"] - base
    doc = {
        "benchmark": "hung_redis",
        "commit": git_commit(),
        "machine": machine_info(),
        "config": {
            **vars(args),
            "out": str(args.out),
            "model": dataclasses.asdict(MODEL),
            "page": PAGE,
        },
        "same_tokens": same,
        "results": results,
        "fresh_engines": fresh,
    }
    hung, none = results["redis_sigstop"], results["none"]
    print(
        f"step median: none {none['step_median_ms']:.2f} ms, "
        f"redis {results['redis']['step_median_ms']:.2f} ms, "
        f"SIGSTOPped redis {hung['step_median_ms']:.2f} ms "
        f"({hung['step_median_vs_none']:.2f}x, p99 {hung['step_p99_ms']:.2f} vs "
        f"{none['step_p99_ms']:.2f} ms); TTFT median hung {hung['ttft_median_ms']:.1f} ms "
        f"vs {none['ttft_median_ms']:.1f} ms; same tokens: {same}; fresh engines' first "
        f"call median none {fresh['none']['first_call_median_ms']:.1f} ms, CPU tier "
        f"{fresh['cpu']['first_call_median_ms']:.1f} ms, redis "
        f"{fresh['redis']['first_call_median_ms']:.1f} ms, SIGSTOPped redis "
        f"{fresh['redis_sigstop']['first_call_median_ms']:.1f} ms"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
