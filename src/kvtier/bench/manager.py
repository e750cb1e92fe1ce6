"""``kvtier bench manager``: per-block cost of the scheduler-side manager, against LRU.

For each tier size (``--blocks``, default 4,096, 65,536 and 1,000,000 blocks) and each
policy, a tier is filled, optionally with ``--pinned`` of its coldest blocks pinned by
loads (the worst place for them; default a quarter of the tier), and each operation is
timed in rounds of ``--rounds`` calls of ``--batch`` keys:

* ``lookup`` and ``touch`` of resident blocks;
* ``prepare_load`` + ``complete_load`` of resident, unpinned blocks;
* ``prepare_store`` + ``complete_store`` of new blocks, each batch evicting as many.

The resident blocks used are a hot set of at most half the unpinned ones (and at most
``rounds * batch``), used in turn: it fits in every policy's list of reused blocks, as
a working set does, where a cyclic scan of the whole tier is every LRU's worst case
rather than the cost of a call.

Every policy but LRU is measured paired with an LRU tier of the same size and pins,
filled and driven alike: their timed rounds alternate (the first of each pair
alternating too), so both see the same load on a shared machine. Reported: median
nanoseconds per block over ``--repeats`` rounds, as CPU time of the benchmark's thread
(the manager is single-threaded; wall time also counts waiting for a core) and as wall
time; the median of the rounds' CPU ratios to LRU (the scheduler's hot paths are
budgeted relative to LRU); and the ratio of the pinned run to the unpinned one (1.0
means eviction does not grow with pins). Progress goes to stderr, one line per
measurement.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kvtier import options
from kvtier.blocks import BlockHash
from kvtier.errors import ConfigError
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.scheduler import POLICIES, CPUOffloadingManager

OPS = ("lookup", "touch", "load", "store_evict")
SIZES = (4096, 65_536, 1_000_000)
"""Tier sizes measured by default: in step (below 65,536 blocks ``leader`` and
``adaptive`` run full-size shadows) and sampled, up to a million blocks."""

PINNED_SHARE = 0.25
"""Blocks pinned by default, as a share of the tier."""


def _key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


class _Tier:
    """A filled tier of one policy and the timed operations over it."""

    def __init__(
        self, policy: str, blocks: int, pinned: int, batch: int, rounds: int, repeats: int
    ) -> None:
        m = CPUOffloadingManager(num_blocks=blocks, block_size=16, eviction_policy=policy)
        for start in range(0, blocks, batch):
            ks = [_key(i) for i in range(start, min(start + batch, blocks))]
            out = m.prepare_store(ks)
            assert out is not None
            m.complete_store(ks)
        if pinned:
            m.prepare_load([_key(i) for i in range(pinned)])  # the coldest blocks
        self.manager = m
        hot = max(batch, min(rounds * batch, (blocks - pinned) // 2))  # the hot set's size
        self._hot = [
            [_key(pinned + (r * batch + j) % hot) for j in range(batch)] for r in range(rounds)
        ]
        fresh = itertools.count(blocks)  # new keys for every round of stores, made now
        self._new = iter(
            [[_key(next(fresh)) for _ in range(batch)] for _ in range((repeats + 1) * rounds)]
        )
        self._rounds = rounds
        self._batch = batch
        self.ops: dict[str, Callable[[], None]] = dict(
            zip(OPS, (self._lookups, self._touches, self._loads, self._stores), strict=True)
        )

    def _lookups(self) -> None:
        for ks in self._hot:
            self.manager.lookup(ks)

    def _touches(self) -> None:
        for ks in self._hot:
            self.manager.touch(ks)

    def _loads(self) -> None:
        m = self.manager
        for ks in self._hot:
            m.prepare_load(ks)
            m.complete_load(ks)

    def _stores(self) -> None:
        m = self.manager
        for _ in range(self._rounds):
            ks = next(self._new)
            out = m.prepare_store(ks)
            assert out is not None and len(out.block_hashes_evicted) == len(ks)
            m.complete_store(ks)


def measure(
    policy: str, blocks: int, pinned: int, batch: int, rounds: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Median ns per block of each operation for one policy, size and pin count, with
    LRU's in the same rounds and the median per-round ratio to it (``lru`` alone for
    LRU itself, its ratio 1).

    Returns ``{"cpu": {op: ns}, "wall": {op: ns}, "lru_cpu": {op: ns},
    "ratio_to_lru": {op: x}}``.
    """
    tiers = [_Tier(policy, blocks, pinned, batch, rounds, repeats)]
    if policy != "lru":
        tiers.append(_Tier("lru", blocks, pinned, batch, rounds, repeats))
    per_block = 1e9 / (rounds * batch)
    out: dict[str, dict[str, float]] = {"cpu": {}, "wall": {}, "lru_cpu": {}, "ratio_to_lru": {}}
    for op in OPS:
        cpu: list[list[float]] = [[] for _ in tiers]
        wall: list[list[float]] = [[] for _ in tiers]
        for r in range(repeats + 1):  # round 0 warms up and is not counted
            order = list(enumerate(tiers))
            for i, tier in order if r % 2 else order[::-1]:
                w, c = time.perf_counter(), time.thread_time()
                tier.ops[op]()
                c, w = time.thread_time() - c, time.perf_counter() - w
                if r:
                    cpu[i].append(c * per_block)
                    wall[i].append(w * per_block)
        out["cpu"][op] = statistics.median(cpu[0])
        out["wall"][op] = statistics.median(wall[0])
        out["lru_cpu"][op] = statistics.median(cpu[-1])
        out["ratio_to_lru"][op] = statistics.median(
            a / b for a, b in zip(cpu[0], cpu[-1], strict=True)
        )
    return out


def _pins(args: argparse.Namespace, blocks: int) -> int:
    return round(PINNED_SHARE * blocks) if args.pinned is None else int(args.pinned)


def run(args: argparse.Namespace, sizes: list[int], policies: list[str]) -> dict[str, Any]:
    """All measurements, keyed ``size -> policy -> pinned count -> figures``."""
    steps = [(b, p, n) for b in sizes for p in policies for n in dict.fromkeys((0, _pins(args, b)))]
    out: dict[str, Any] = {}
    for done, (blocks, policy, pinned) in enumerate(steps, 1):
        print(
            f"bench manager: {blocks:,} blocks, {policy}, {pinned:,} pinned ({done}/{len(steps)})",
            file=sys.stderr,
            flush=True,
        )
        figures = measure(policy, blocks, pinned, args.batch, args.rounds, args.repeats)
        out.setdefault(str(blocks), {}).setdefault(policy, {})[str(pinned)] = figures
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench manager`` (each checked before anything is measured)."""
    parser.add_argument(
        "--blocks",
        type=options.positive,
        action="append",
        help="tier capacity in blocks, repeatable "
        f"(default: {', '.join(f'{size:,}' for size in SIZES)})",
    )
    parser.add_argument(
        "--pinned",
        type=options.non_negative,
        help="blocks pinned by loads (default: a quarter of each tier)",
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
    """Measure, print a table per size and one summary line, write the JSON.

    Raises:
        ConfigError: a bad option (named), found before anything is measured.
    """
    sizes = list(dict.fromkeys(args.blocks or SIZES))
    for blocks in sizes:
        if _pins(args, blocks) + args.batch > blocks:
            raise ConfigError(
                "--pinned",
                f"{_pins(args, blocks)} pinned + a batch of {args.batch} exceed --blocks {blocks}",
            )
    out = check_output("--json", args.json or default_path("manager"))
    policies = args.policy or sorted(POLICIES)
    config: dict[str, Any] = {k: getattr(args, k) for k in ("pinned", "batch", "rounds", "repeats")}
    config.update(blocks=sizes, pinned_share=PINNED_SHARE, policies=policies)
    results = run(args, sizes, policies)
    worst: dict[str, tuple[float, str]] = {op: (0.0, "") for op in OPS}
    worst_pinned = 0.0
    for size, by_policy in results.items():
        print(f"{int(size):,} blocks: CPU ns/block (x LRU in the same rounds)")
        print(f"  {'policy':<9}{'pinned':>9}" + "".join(f"{op:>17}" for op in OPS))
        for policy, by_pin in by_policy.items():
            for pin, m in by_pin.items():
                print(
                    f"  {policy:<9}{int(pin):>9,}"
                    + "".join(f"{m['cpu'][op]:>9.0f} ({m['ratio_to_lru'][op]:>4.2f})" for op in OPS)
                )
                for op in OPS:
                    if m["ratio_to_lru"][op] > worst[op][0]:
                        worst[op] = (m["ratio_to_lru"][op], f"{policy} at {int(size):,}")
            pins = list(by_pin)
            if len(pins) > 1:
                ratio = by_pin[pins[-1]]["cpu"]["store_evict"] / by_pin["0"]["cpu"]["store_evict"]
                worst_pinned = max(worst_pinned, ratio)
    path = write_result("manager", config, results, out)
    print(
        "manager: worst CPU cost x LRU "
        + ", ".join(f"{op} {worst[op][0]:.2f} ({worst[op][1]})" for op in OPS)
        + f"; store+evict pinned/unpinned <= {worst_pinned:.2f}; wrote {path}"
    )
    return 0
