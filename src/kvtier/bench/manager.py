"""``kvtier bench manager``: per-block cost of the scheduler-side manager.

For each policy, a tier of ``--blocks`` blocks is filled, optionally with ``--pinned``
of its coldest blocks pinned by loads (the worst place for them), and each operation
is timed in batches of ``--batch`` keys:

* ``lookup`` and ``touch`` of resident blocks;
* ``prepare_load`` + ``complete_load`` of resident, unpinned blocks;
* ``prepare_store`` + ``complete_store`` of new blocks, each batch evicting as many.

Reported: median nanoseconds per block over ``--repeats`` rounds, as CPU time of the
benchmark's thread (the manager is single-threaded; on a shared machine wall time also
counts waiting for a core) and as wall time, and the ratio of the pinned run to the
unpinned one (1.0 means eviction does not grow with pins).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

from kvtier import options
from kvtier.bench.report import median_time
from kvtier.blocks import BlockHash
from kvtier.errors import ConfigError
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.scheduler import POLICIES, CPUOffloadingManager

OPS = ("lookup", "touch", "load", "store_evict")


def _key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def measure(
    policy: str, blocks: int, pinned: int, batch: int, rounds: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Median ns per block of each operation for one policy and pin count."""
    m = CPUOffloadingManager(num_blocks=blocks, block_size=16, eviction_policy=policy)
    for start in range(0, blocks, batch):
        ks = [_key(i) for i in range(start, min(start + batch, blocks))]
        out = m.prepare_store(ks)
        assert out is not None
        m.complete_store(ks)
    if pinned:
        m.prepare_load([_key(i) for i in range(pinned)])  # the coldest blocks
    hot = [
        [_key(pinned + (r * batch + j) % (blocks - pinned)) for j in range(batch)]
        for r in range(rounds)
    ]
    # New keys for every timed and untimed round of stores, made before timing.
    fresh = itertools.count(blocks)
    new_batches = iter(
        [[_key(next(fresh)) for _ in range(batch)] for _ in range(2 * (repeats + 1) * rounds)]
    )

    def lookups() -> None:
        for ks in hot:
            m.lookup(ks)

    def touches() -> None:
        for ks in hot:
            m.touch(ks)

    def loads() -> None:
        for ks in hot:
            m.prepare_load(ks)
            m.complete_load(ks)

    def stores() -> None:
        for _ in range(rounds):
            ks = next(new_batches)
            out = m.prepare_store(ks)
            assert out is not None and len(out.block_hashes_evicted) == batch
            m.complete_store(ks)

    per_block = 1e9 / (rounds * batch)
    result: dict[str, dict[str, float]] = {"cpu": {}, "wall": {}}
    for name, fn in zip(OPS, (lookups, touches, loads, stores), strict=True):
        result["cpu"][name] = median_time(fn, repeats, clock=time.thread_time) * per_block
        result["wall"][name] = median_time(fn, repeats) * per_block
    return result


def run(
    policies: list[str], blocks: int, pinned: int, batch: int, rounds: int, repeats: int
) -> dict[str, Any]:
    """All measurements, keyed ``policy -> pinned count -> op -> ns/block``."""
    out: dict[str, Any] = {}
    for policy in policies:
        out[policy] = {
            str(p): measure(policy, blocks, p, batch, rounds, repeats) for p in (0, pinned)
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench manager`` (each checked before anything is measured)."""
    parser.add_argument(
        "--blocks", type=options.positive, default=200_000, help="tier capacity in blocks"
    )
    parser.add_argument(
        "--pinned", type=options.non_negative, default=50_000, help="blocks pinned by loads"
    )
    parser.add_argument("--batch", type=options.positive, default=64, help="keys per call")
    parser.add_argument(
        "--rounds", type=options.positive, default=400, help="calls per timed round"
    )
    parser.add_argument("--repeats", type=options.positive, default=5, help="timed rounds (median)")
    parser.add_argument(
        "--policy",
        action="append",
        choices=sorted(POLICIES),
        help="policy to measure (repeatable; default: all)",
    )
    add_json_option(parser, "manager")


def main(args: argparse.Namespace) -> int:
    """Measure, print a table and one summary line, write the JSON.

    Raises:
        ConfigError: a bad option (named), found before anything is measured.
    """
    if args.pinned + args.batch > args.blocks:
        raise ConfigError(
            "--pinned", f"{args.pinned} pinned + a batch of {args.batch} exceed --blocks"
        )
    out = check_output("--json", args.json or default_path("manager"))
    policies = args.policy or sorted(POLICIES)
    config = {k: getattr(args, k) for k in ("blocks", "pinned", "batch", "rounds", "repeats")}
    config["policies"] = policies
    results = run(policies, args.blocks, args.pinned, args.batch, args.rounds, args.repeats)
    print(
        f"{'policy':<8}{'pinned':>8}"
        + "".join(f"{op:>13}" for op in OPS)
        + "   (CPU ns/block; wall in brackets)"
    )
    worst_ratio = 0.0
    for policy, by_pin in results.items():
        for pin, m in by_pin.items():
            print(
                f"{policy:<8}{pin:>8}"
                + "".join(f"{m['cpu'][op]:>6.0f} ({m['wall'][op]:>4.0f})" for op in OPS)
            )
        ratio = by_pin[str(args.pinned)]["cpu"]["store_evict"] / by_pin["0"]["cpu"]["store_evict"]
        worst_ratio = max(worst_ratio, ratio)
    path = write_result("manager", config, results, out)
    worst = {op: max(r[p]["cpu"][op] for r in results.values() for p in r) for op in OPS}
    print(
        f"manager: worst CPU ns/block lookup {worst['lookup']:.0f}, touch {worst['touch']:.0f}, "
        f"load {worst['load']:.0f}, store+evict {worst['store_evict']:.0f}; "
        f"store+evict pinned/unpinned ratio <= {worst_ratio:.2f}; wrote {path}"
    )
    return 0
