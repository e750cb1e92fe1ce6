"""``kvtier simulate``: replay a trace through the manager; compare with Belady.

Runs in its own process (scheduler side only, no torch). One capacity::

    kvtier simulate --capacity 5%                  # the engine's default policy
    kvtier simulate --capacity 5% --policy lru
    kvtier simulate --trace T.jsonl --capacity 8GiB --kv-bytes-per-token 160KiB --json out.json

A sweep (several policies, several capacities, a PNG and JSON)::

    kvtier simulate --sweep 1%,5%,10%,25%,50% --policy lru --policy arc --policy slru \\
        --plot sweep.png --json sweep.json

Every option is checked before the replay. Results go to
``kvtier-results/simulate-<host>-<time>.json`` unless ``--json`` says where.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from kvtier import options
from kvtier.config import DEFAULT_EVICTION_POLICY
from kvtier.errors import ConfigError, TraceError
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.scheduler.policies import POLICIES
from kvtier.sim.capacity import Capacity, parse_capacities, parse_capacity
from kvtier.sim.metrics import HitRatios
from kvtier.sim.progress import Progress
from kvtier.sim.sweep import SweepPoint, point_to_json, run_sweep, run_to_json
from kvtier.sim.trace import DEFAULT_BLOCK_SIZE, Trace, read_mooncake
from kvtier.sim.traces import SYNTHETIC_TRACE
from kvtier.sim.workload import SHAPES, generate, shaped

DEFAULT_TRACE = SYNTHETIC_TRACE
"""The trace used when none is given: Mooncake's synthetic trace, shipped in the package."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``kvtier simulate`` to ``parser``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--trace",
        type=Path,
        help="Mooncake-format JSON-lines trace"
        + (f" (default: {DEFAULT_TRACE})" if DEFAULT_TRACE.is_file() else ""),
    )
    source.add_argument(
        "--generate",
        type=int,
        metavar="SEED",
        help="replay a generated workload with this seed instead of a file (see --shape)",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="mixed",
        help="shape of the --generate workload: chats and documents (mixed), chat, "
        "documents, or agents on long shared tool prompts (default: %(default)s)",
    )
    parser.add_argument(
        "--disk-capacity",
        metavar="CAP",
        help="replay a CPU tier with a disk tier of this capacity behind it (inclusive, "
        "write-through; same forms as --capacity); hits are reported per tier",
    )
    parser.add_argument(
        "--block-size",
        type=options.positive,
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per block of the trace's hash_ids (default: %(default)s)",
    )
    parser.add_argument(
        "--capacity",
        default="5%",
        help="tier capacity: blocks (4096), share of distinct blocks (5%%), or bytes "
        "(8GiB, needs --kv-bytes-per-token) (default: %(default)s)",
    )
    parser.add_argument(
        "--sweep",
        metavar="CAPS",
        help="comma-separated capacities (1%%,5%%,10%%); replaces --capacity",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        choices=sorted(POLICIES),
        help=f"eviction policy, repeatable (default: the engine's, {DEFAULT_EVICTION_POLICY})",
    )
    parser.add_argument(
        "--store-threshold",
        type=options.non_negative,
        default=0,
        help="store a block only once looked up this many times (0: always; default: 0)",
    )
    parser.add_argument(
        "--kv-bytes-per-token",
        type=options.size,
        metavar="SIZE",
        help="the model's KV cache bytes per token (163840 or 160KiB), for byte capacities",
    )
    parser.add_argument("--no-belady", action="store_true", help="skip the Belady reference")
    add_json_option(parser, "simulate")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="draw the sweep as a PNG")
    parser.add_argument("--no-progress", action="store_true", help="never draw a progress bar")


def _load(args: argparse.Namespace) -> Trace:
    if args.generate is not None:
        return generate(shaped(args.shape, args.generate, block_size=args.block_size))
    path = args.trace
    if path is None:
        path = DEFAULT_TRACE
    elif not path.is_file():
        raise ConfigError("--trace", f"{path} is not a file; give a Mooncake-format trace")
    trace = read_mooncake(path, block_size=args.block_size)
    if not trace.requests:
        raise TraceError(f"{path} holds no requests; give a trace with at least one")
    return trace


def _pct(value: float) -> str:
    return f"{100 * value:6.2f} %"


def _print_point(point: SweepPoint) -> None:
    print(f"capacity {point.capacity} = {point.capacity_blocks} blocks")
    print(f"  {'policy':<12} {'block hits':>10} {'token hits':>11} {'request mean':>13}")
    rows: list[tuple[str, HitRatios]] = [(run.policy, run.ratios) for run in point.runs]
    if point.belady is not None:
        rows.append(("belady*", point.belady))
    for name, ratios in rows:
        print(
            f"  {name:<12} {_pct(ratios.block_hit_ratio):>10} {_pct(ratios.token_hit_ratio):>11}"
            f" {_pct(ratios.request_hit_ratio_mean):>13}"
        )
    for run in point.runs:
        tiers = ", ".join(
            f"{t.medium} {t.capacity_blocks} blocks: {_pct(t.block_hit_ratio).strip()}"
            for t in run.tiers
        )
        print(
            f"  {run.policy}: per tier {tiers}; replay {run.seconds:.2f} s, "
            f"{run.accesses_per_second:,.0f} block accesses/s"
        )


def _print_sweep(points: Sequence[SweepPoint]) -> None:
    head = "".join(f"{p.capacity:>9}" for p in points)
    print(f"block hit ratio (%)   {head}")
    print(f"capacity (blocks)     {''.join(f'{p.capacity_blocks:>9}' for p in points)}")
    for index, run in enumerate(points[0].runs if points else ()):
        cells = "".join(f"{100 * p.runs[index].ratios.block_hit_ratio:>9.2f}" for p in points)
        print(f"  {run.policy:<20}{cells}")
        for tier in range(1, len(run.tiers)):  # a tiered replay: what each tier served
            for name, t in (("cpu", 0), ("disk", tier)):
                cells = "".join(
                    f"{100 * p.runs[index].tiers[t].block_hit_ratio:>9.2f}" for p in points
                )
                print(f"    {name + ' hits':<18}{cells}")
    if points and all(p.belady is not None for p in points):
        cells = "".join(f"{100 * p.belady.block_hit_ratio:>9.2f}" for p in points if p.belady)
        print(f"  {'belady (offline)':<20}{cells}")


def _check_capacities(capacities: Sequence[Capacity], trace: Trace, kv_bytes: int | None) -> None:
    for cap in capacities:
        blocks = cap.blocks(
            distinct_blocks=trace.num_distinct_blocks,
            block_size=trace.block_size,
            kv_bytes_per_token=kv_bytes,
        )
        if blocks < 1:
            raise ConfigError(
                "--sweep" if len(capacities) > 1 else "--capacity",
                f"{cap.text!r} is {blocks} blocks of this trace; give at least one block",
            )


def main(args: argparse.Namespace) -> int:
    """Run ``kvtier simulate``; returns 0 (bad input raises, and the ``kvtier`` command
    answers it with one line and exit 2).

    Raises:
        ConfigError: a bad option (named), found before the replay.
        TraceError: the trace is malformed or empty.
    """
    policies = args.policy or [DEFAULT_EVICTION_POLICY]
    sweeping = args.sweep is not None
    capacities = parse_capacities(args.sweep) if sweeping else (parse_capacity(args.capacity),)
    disk_capacity = (
        parse_capacity(args.disk_capacity, "--disk-capacity") if args.disk_capacity else None
    )
    out = check_output("--json", args.json or default_path("simulate"))
    if args.plot is not None:
        check_output("--plot", args.plot)
    trace = _load(args)
    _check_capacities(capacities, trace, args.kv_bytes_per_token)
    total = len(trace.requests) * len(capacities) * (len(policies) + (not args.no_belady))
    progress = Progress(total, enabled=False if args.no_progress else None)
    points = run_sweep(
        trace,
        capacities,
        policies,
        kv_bytes_per_token=args.kv_bytes_per_token,
        store_threshold=args.store_threshold,
        disk_capacity=disk_capacity,
        with_belady=not args.no_belady,
        progress=progress,
    )
    progress.close()
    if args.plot is not None:
        from kvtier.sim.plot import plot_sweep

        plot_sweep(points, args.plot, f"{Path(trace.source).name}: hit ratio vs capacity")
    print(
        f"trace {trace.source}: {len(trace.requests)} requests, {trace.num_block_refs} block "
        f"references, {trace.num_distinct_blocks} distinct blocks of {trace.block_size} tokens"
    )
    if sweeping:
        _print_sweep(points)
    else:
        _print_point(points[0])
    if not args.no_belady:
        print("* Belady: offline reference (sees the future); no online policy should pass it")
    path = _write_json(args, out, trace, points, sweeping)
    print(f"wrote {path}" + (f" and {args.plot}" if args.plot is not None else ""))
    return 0


def _write_json(
    args: argparse.Namespace, out: Path, trace: Trace, points: Sequence[SweepPoint], sweeping: bool
) -> Path:
    config: dict[str, object] = {
        "trace": {
            "source": trace.source,
            "requests": len(trace.requests),
            "block_refs": trace.num_block_refs,
            "distinct_blocks": trace.num_distinct_blocks,
            "block_size": trace.block_size,
        },
        "policies": args.policy or [DEFAULT_EVICTION_POLICY],
        "capacities": [p.capacity for p in points],
        "store_threshold": args.store_threshold,
        "disk_capacity": args.disk_capacity,
        "kv_bytes_per_token": args.kv_bytes_per_token,
        "belady": not args.no_belady,
    }
    results: dict[str, object] = {}
    if sweeping:
        results["points"] = [point_to_json(p) for p in points]
    else:
        # A single capacity: the first --policy's ratios at the top level, every run below.
        point = points[0]
        results.update(run_to_json(point.runs[0]))
        results.update(point_to_json(point))
    return write_result("simulate", config, results, out)
