"""``kvtier simulate``: replay a trace through the manager; compare with Belady.

Runs in its own process (scheduler side only, no torch). One capacity::

    kvtier simulate --trace T.jsonl --capacity 5% --policy lru
    kvtier simulate --trace T.jsonl --capacity 8GiB --kv-bytes-per-token 160KiB --json out.json

A sweep (several policies, several capacities, a PNG and JSON)::

    kvtier simulate --sweep 1%,5%,10%,25%,50% --policy lru --policy arc --policy slru \\
        --plot sweep.png --json sweep.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kvtier.errors import KvtierError
from kvtier.sim.capacity import parse_capacities, parse_capacity, parse_size
from kvtier.sim.metrics import HitRatios
from kvtier.sim.progress import Progress
from kvtier.sim.sweep import SweepPoint, point_to_json, run_sweep, run_to_json
from kvtier.sim.trace import DEFAULT_BLOCK_SIZE, Trace, read_mooncake
from kvtier.sim.traces import SYNTHETIC_TRACE
from kvtier.sim.workload import SHAPES, generate, shaped

_REPO_ROOT = Path(__file__).resolve().parents[3]
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
        type=int,
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
        help="eviction policy, repeatable (default: lru); see kvtier.scheduler.POLICIES",
    )
    parser.add_argument(
        "--store-threshold",
        type=int,
        default=0,
        help="store a block only once looked up this many times (0: always; default: 0)",
    )
    parser.add_argument(
        "--kv-bytes-per-token",
        metavar="SIZE",
        help="the model's KV cache bytes per token (163840 or 160KiB), for byte capacities",
    )
    parser.add_argument("--no-belady", action="store_true", help="skip the Belady reference")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write results as JSON")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="draw the sweep as a PNG")
    parser.add_argument("--no-progress", action="store_true", help="never draw a progress bar")


def _load(args: argparse.Namespace) -> Trace:
    if args.generate is not None:
        return generate(shaped(args.shape, args.generate, block_size=args.block_size))
    path = args.trace
    if path is None:
        if not DEFAULT_TRACE.is_file():
            raise KvtierError("no trace given: pass --trace PATH (or --generate SEED)")
        path = DEFAULT_TRACE
    return read_mooncake(path, block_size=args.block_size)


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


def _environment() -> dict[str, object]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(_REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "commit": commit or None,
    }


def main(args: argparse.Namespace) -> int:
    """Run ``kvtier simulate``; returns the exit status (0 ok, 2 bad input)."""
    try:
        trace = _load(args)
        policies = args.policy or ["lru"]
        kv_bytes = (
            parse_size(args.kv_bytes_per_token, "--kv-bytes-per-token")
            if args.kv_bytes_per_token
            else None
        )
        sweeping = args.sweep is not None
        capacities = parse_capacities(args.sweep) if sweeping else (parse_capacity(args.capacity),)
        total = len(trace.requests) * len(capacities) * (len(policies) + (not args.no_belady))
        progress = Progress(total, enabled=False if args.no_progress else None)
        points = run_sweep(
            trace,
            capacities,
            policies,
            kv_bytes_per_token=kv_bytes,
            store_threshold=args.store_threshold,
            disk_capacity=parse_capacity(args.disk_capacity, "--disk-capacity")
            if args.disk_capacity
            else None,
            with_belady=not args.no_belady,
            progress=progress,
        )
        progress.close()
        if args.plot is not None:
            from kvtier.sim.plot import plot_sweep

            plot_sweep(points, args.plot, f"{Path(trace.source).name}: hit ratio vs capacity")
    except KvtierError as exc:
        print(f"kvtier simulate: {exc}", file=sys.stderr)
        return 2
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
    if args.json is not None:
        try:
            _write_json(args, trace, points, sweeping)
        except OSError as exc:
            print(f"kvtier simulate: cannot write {args.json}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.plot is not None:
        print(f"plot written to {args.plot}")
    return 0


def _write_json(
    args: argparse.Namespace, trace: Trace, points: Sequence[SweepPoint], sweeping: bool
) -> None:
    doc: dict[str, object] = {
        "trace": {
            "source": trace.source,
            "requests": len(trace.requests),
            "block_refs": trace.num_block_refs,
            "distinct_blocks": trace.num_distinct_blocks,
            "block_size": trace.block_size,
        },
        "config": {
            "policies": args.policy or ["lru"],
            "capacities": [p.capacity for p in points],
            "store_threshold": args.store_threshold,
            "disk_capacity": args.disk_capacity,
            "kv_bytes_per_token": args.kv_bytes_per_token,
        },
        **_environment(),
    }
    if sweeping:
        doc["points"] = [point_to_json(p) for p in points]
    else:
        # A single capacity: the first --policy's ratios at the top level, every run below.
        point = points[0]
        doc.update(run_to_json(point.runs[0]))
        doc.update(point_to_json(point))
    args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
