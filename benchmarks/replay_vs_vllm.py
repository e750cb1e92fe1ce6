"""Trace replay through kvtier's manager and vLLM 0.33's CPU offloading manager, side by side.

Both managers replay the shipped synthetic trace (``kvtier simulate``'s default) at the
same capacities (1, 5 and 10 % of its distinct blocks), with LRU, and the same calls per
request, as an engine makes them::

    hit = lookup(keys)                 # vLLM: one lookup per key until the first miss
    prepare_load(keys[:hit])           # if hit: pin the blocks to load
    touch(keys)
    out = prepare_store(keys[hit:])    # evicts to make room (the loaded ones are pinned)
    complete_load(keys[:hit])          # if hit
    complete_store(out's keys)         # if out is not None
    touch(keys)                        # the whole request most recent, key 0 first

vLLM's manager also gets ``on_new_request`` / ``on_request_finished`` around each request
(its protocol; they are timed with it). vLLM's keys are kvtier's 8-byte keys with its
4-byte group index appended (``make_offload_key``), built before timing, as kvtier's are.

Each round replays every capacity through both managers, alternating which goes first;
reported are block accesses per CPU-second of the thread (robust on a shared machine)
and per wall-second, medians over ``--rounds``, and kvtier / vLLM. Hit blocks of both
are reported as a sanity check: the two LRUs break ties differently (vLLM's ranks
blocks by request), so they need not agree exactly. Run with vLLM 0.33's python::

    PYTHONPATH=src .venv-vllm033/bin/python benchmarks/replay_vs_vllm.py  # scripts/setup-vllm.sh

Without vLLM importable only kvtier is measured (``vllm`` is ``null`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtier.bench.report import git_commit, machine_info
from kvtier.scheduler import CPUOffloadingManager
from kvtier.sim.cli import DEFAULT_TRACE
from kvtier.sim.trace import Trace, read_mooncake

SHARES = (0.01, 0.05, 0.10)
RESULTS = Path(__file__).resolve().parent / "results"

Replay = Callable[[], tuple[int, float, float]]  # -> (hit blocks, CPU s, wall s)


def kvtier_replay(trace: Trace, capacity: int) -> Replay:
    """A replay of ``trace`` through a fresh kvtier LRU manager of ``capacity`` blocks."""
    requests = [r.keys for r in trace.requests]

    def run() -> tuple[int, float, float]:
        m = CPUOffloadingManager(num_blocks=capacity, block_size=trace.block_size)
        lookup, touch = m.lookup, m.touch
        prepare_load, complete_load = m.prepare_load, m.complete_load
        prepare_store, complete_store = m.prepare_store, m.complete_store
        hits = 0
        cpu, wall = time.thread_time(), time.perf_counter()
        for keys in requests:
            hit = lookup(keys)
            if hit:
                prepare_load(keys[:hit])
            touch(keys)
            out = prepare_store(keys[hit:])
            if hit:
                complete_load(keys[:hit])
            if out is not None:
                complete_store(out.block_hashes_to_store)
            touch(keys)
            hits += hit
        return hits, time.thread_time() - cpu, time.perf_counter() - wall

    return run


def vllm_replay(trace: Trace, capacity: int) -> Replay | None:
    """The same replay through vLLM 0.33's ``CPUOffloadingManager`` (LRU), or ``None``
    when vLLM is not importable here."""
    try:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmManager
    except ImportError:
        return None
    requests = [[make_offload_key(k, 0) for k in r.keys] for r in trace.requests]
    hit_result = LookupResult.HIT

    def run() -> tuple[int, float, float]:
        m = VllmManager(num_chunks=capacity, cache_policy="lru")
        lookup, touch = m.lookup, m.touch
        prepare_load, complete_load = m.prepare_load, m.complete_load
        prepare_store, complete_store = m.prepare_store, m.complete_store
        hits = 0
        cpu, wall = time.thread_time(), time.perf_counter()
        for i, keys in enumerate(requests):
            ctx = ReqContext(req_id=str(i))
            m.on_new_request(ctx)
            hit = 0
            for key in keys:
                if lookup(key, ctx) is not hit_result:
                    break
                hit += 1
            if hit:
                prepare_load(keys[:hit], ctx)
            touch(keys, ctx)
            out = prepare_store(keys[hit:], ctx)
            if hit:
                complete_load(keys[:hit], ctx)
            if out is not None:
                complete_store(out.keys_to_store, ctx)
            touch(keys, ctx)
            m.on_request_finished(ctx)
            hits += hit
        return hits, time.thread_time() - cpu, time.perf_counter() - wall

    return run


def measure(trace: Trace, shares: Sequence[float], rounds: int) -> list[dict[str, Any]]:
    """Interleaved rounds; one row per capacity with both sides' medians and ratios."""
    sides: list[tuple[float, int, dict[str, Replay | None]]] = []
    for share in shares:
        capacity = round(share * trace.num_distinct_blocks)
        runs = {"kvtier": kvtier_replay(trace, capacity), "vllm": vllm_replay(trace, capacity)}
        sides.append((share, capacity, runs))
    samples: dict[tuple[float, str], list[tuple[int, float, float]]] = {}
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        for share, _, runs in sides:
            names = ["kvtier", "vllm"] if r % 2 else ["vllm", "kvtier"]
            for name in names:
                run = runs[name]
                if run is not None:
                    out = run()
                    if r:
                        samples.setdefault((share, name), []).append(out)
    rows = []
    refs = trace.num_block_refs
    for share, capacity, runs in sides:
        row: dict[str, Any] = {"capacity": f"{share:.0%}", "capacity_blocks": capacity}
        for name in runs:
            got = samples.get((share, name))
            row[name] = (
                None
                if got is None
                else {
                    "hit_blocks": sorted({h for h, _, _ in got}),
                    "accesses_per_cpu_second": statistics.median(refs / c for _, c, _ in got),
                    "accesses_per_wall_second": statistics.median(refs / w for _, _, w in got),
                }
            )
        if row["vllm"] is not None:
            k, v = row["kvtier"], row["vllm"]
            row["ratio_cpu"] = k["accesses_per_cpu_second"] / v["accesses_per_cpu_second"]
            row["ratio_wall"] = k["accesses_per_wall_second"] / v["accesses_per_wall_second"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--out", type=Path, help="JSON path (default: under results/)")
    args = parser.parse_args()
    trace = read_mooncake(args.trace)
    load_before = os.getloadavg()
    rows = measure(trace, SHARES, args.rounds)
    load_after = os.getloadavg()
    for row in rows:
        k, v = row["kvtier"], row["vllm"]
        line = (
            f"  {row['capacity']:>4} ({row['capacity_blocks']} blocks): kvtier "
            f"{k['accesses_per_cpu_second']:>10,.0f}/CPU-s (hits {k['hit_blocks']})"
        )
        if v is not None:
            line += (
                f"  vLLM {v['accesses_per_cpu_second']:>10,.0f}/CPU-s (hits {v['hit_blocks']})"
                f"  ratio {row['ratio_cpu']:.2f} (wall {row['ratio_wall']:.2f})"
            )
        print(line)
    ratios = [r["ratio_cpu"] for r in rows if "ratio_cpu" in r]
    print(
        f"replay vs vLLM 0.33 (LRU, {trace.num_block_refs} block accesses, median of "
        f"{args.rounds}): kvtier / vLLM per CPU-second "
        + (", ".join(f"{r['capacity']} {r['ratio_cpu']:.2f}x" for r in rows) if ratios else "n/a")
    )
    vllm_version = None
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        pass
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or RESULTS / f"replay-vs-vllm-{stamp}.json"
    doc = {
        "benchmark": "replay_vs_vllm",
        "trace": str(args.trace),
        "block_refs": trace.num_block_refs,
        "requests": len(trace.requests),
        "config": {"rounds": args.rounds, "shares": SHARES, "policy": "lru"},
        "vllm_version": vllm_version,
        "machine": {**machine_info(), "load_average": [load_before, load_after]},
        "commit": git_commit(),
        "results": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
