"""Paired A/B of two eviction policies' per-block manager cost, for a loaded machine.

``kvtier bench manager`` times each policy in turn, so on a shared machine its two
policies see different loads. This interleaves them instead: two managers of
``--blocks`` blocks (filled as the bench fills them, ``--pinned`` coldest blocks pinned
by a load), then for each operation ``--rounds`` alternating rounds of 400 batches of
64 keys, A then B, each timed in CPU time of the thread. Reported: the median ns per
block of each, and the median of the per-round ratios A / B. The lookups repeat the
bench's 400 hot batches (so a sampled policy sees the bench's share of sampled
requests); the stores use new keys, each evicting as many. Run from the repository
root::

    PYTHONPATH=src nice python benchmarks/manager_pair_ab.py leader lru \
        --out benchmarks/results/manager_pair_leader_lru.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from kvtier.bench.report import git_commit, machine_info
from kvtier.blocks import BlockHash
from kvtier.scheduler import CPUOffloadingManager

BATCH = 64
BATCHES = 400


def _key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def _filled(policy: str, blocks: int, pinned: int) -> CPUOffloadingManager:
    m = CPUOffloadingManager(num_blocks=blocks, block_size=16, eviction_policy=policy)
    for start in range(0, blocks, BATCH):
        ks = [_key(i) for i in range(start, min(start + BATCH, blocks))]
        m.prepare_store(ks)
        m.complete_store(ks)
    if pinned:
        m.prepare_load([_key(i) for i in range(pinned)])
    return m


def measure(a: str, b: str, blocks: int, pinned: int, rounds: int) -> dict[str, object]:
    """Per operation: median ns/block of each policy and the median paired ratio."""
    ms = {a: _filled(a, blocks, pinned), b: _filled(b, blocks, pinned)}
    hot = [
        [_key(pinned + (r * BATCH + j) % (blocks - pinned)) for j in range(BATCH)]
        for r in range(BATCHES)
    ]
    new = [[_key(blocks + r * BATCH + j) for j in range(BATCH)] for r in range(BATCHES * rounds)]
    done = {a: 0, b: 0}

    def lookups(p: str) -> None:
        for ks in hot:
            ms[p].lookup(ks)

    def touches(p: str) -> None:
        for ks in hot:
            ms[p].touch(ks)

    def stores(p: str) -> None:
        m, i = ms[p], done[p]
        done[p] += BATCHES
        for ks in new[i : i + BATCHES]:
            m.prepare_store(ks)
            m.complete_store(ks)

    for p in (a, b):
        lookups(p)  # a policy that learns from lookups has seen the hot batches once
    out: dict[str, object] = {}
    ops: dict[str, Callable[[str], None]] = {
        "lookup": lookups,
        "touch": touches,
        "store_evict": stores,
    }
    for name, fn in ops.items():
        times: dict[str, list[float]] = {a: [], b: []}
        for _ in range(rounds):
            for p in (a, b):
                start = time.thread_time()
                fn(p)
                times[p].append((time.thread_time() - start) / (BATCHES * BATCH) * 1e9)
        ratio = statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
        out[name] = {a: statistics.median(times[a]), b: statistics.median(times[b]), "ratio": ratio}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--blocks", type=int, default=200_000)
    parser.add_argument("--pinned", type=int, nargs="*", default=[0, 50_000])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = {str(p): measure(args.a, args.b, args.blocks, p, args.rounds) for p in args.pinned}
    load = os.getloadavg()
    for pinned, ops in results.items():
        for op, r in ops.items():
            assert isinstance(r, dict)
            print(
                f"pinned {pinned:>6} {op:<12} {args.a} {r[args.a]:7.0f}  {args.b} "
                f"{r[args.b]:7.0f} ns/block CPU   paired ratio {r['ratio']:.2f}"
            )
    print(f"load average before {load_before[0]:.2f}, after {load[0]:.2f}")
    if args.out:
        doc = {
            "benchmark": "manager_pair_ab",
            "machine": machine_info(),
            "commit": git_commit(),
            "load_average": {"before": load_before, "after": load},
            "configuration": {
                "a": args.a,
                "b": args.b,
                "blocks": args.blocks,
                "pinned": args.pinned,
                "rounds": args.rounds,
                "batch": BATCH,
                "batches": BATCHES,
            },
            "results": results,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
