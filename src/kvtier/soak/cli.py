"""``kvtier soak``: the reference engine under random faults; every token checked.

Runs in the ``kvtier soak`` process (see ``kvtier.soak``). Prints the figures and
writes them as JSON (``kvtier-results/soak-*.json`` or ``--json``). Exit status
1 when a token was wrong, an engine crashed or a block was found corrupt.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.results import add_json_option, check_output, default_path, write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of serving")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="stop after N")
    parser.add_argument("--seed", type=int, default=0, help="seeds workload and faults")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run this many seeds back to back (--seed, --seed + 1, ...), each for "
        "--duration seconds; figures per seed and in total",
    )
    parser.add_argument(
        "--fault-interval", type=float, default=4.0, help="mean seconds between faults"
    )
    parser.add_argument(
        "--engine",
        choices=("reference", "vllm"),
        default="reference",
        help="the engine under test: kvtier's reference engine (two processes), or a real "
        "vLLM OpenAI server with kvtier's spec (needs vLLM installed here)",
    )
    parser.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        metavar="TOKENS",
        help="soak a Gemma 3-style hybrid of the soak's model instead (every other layer "
        "attends to the last TOKENS tokens; the reference engine only)",
    )
    add_json_option(parser, "soak")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )


FAILING = ("wrong_tokens", "engine_crashes", "corrupt_blocks_on_restart", "corrupt_blocks_at_end")
"""A seed fails when any of these is not zero."""

SUMMED = ("requests_served", "tokens_compared", "engine_restarts", "failed_loads_recomputed")


def main(args: argparse.Namespace) -> int:
    for key, value in (
        ("--duration", args.duration),
        ("--max-requests", args.max_requests),
        ("--fault-interval", args.fault_interval),
        ("--seeds", args.seeds),
    ):
        if not value > 0:
            raise ConfigError(key, f"must be positive, got {value}")
    if args.sliding_window is not None and not args.sliding_window > 0:
        raise ConfigError("--sliding-window", f"must be positive, got {args.sliding_window}")
    if args.sliding_window is not None and args.engine != "reference":
        raise ConfigError("--sliding-window", "the reference engine only: --engine reference")
    if args.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("--engine", "vllm is not installed here: run this where vLLM is")
    out = check_output("--json", args.json or default_path("soak"))
    per_seed = []
    for seed in range(args.seed, args.seed + args.seeds):
        with tempfile.TemporaryDirectory(prefix="kvtier-soak-", dir=args.workdir) as tmp:
            figures = _soak(args, seed, Path(tmp))
        per_seed.append({"seed": seed, **figures})
        if args.seeds > 1:
            bad = {k: figures[k] for k in FAILING if figures[k]}
            print(
                f"soak: seed {seed}: {figures['requests_served']} requests, "
                f"{sum(figures['faults'].values())} faults, {figures['wrong_tokens']} wrong "
                f"tokens, {figures['engine_crashes']} crashes" + (f"; FAILED {bad}" if bad else ""),
                flush=True,
            )
    config = {
        "duration_s": args.duration,
        "max_requests": args.max_requests,
        "seed": args.seed,
        "seeds": args.seeds,
        "fault_interval_s": args.fault_interval,
        "engine": args.engine,
        "sliding_window": args.sliding_window,
    }
    results: dict[str, Any] = per_seed[0] if args.seeds == 1 else totals(per_seed)
    print(json.dumps(results, indent=2))
    path = write_result("soak", config, results, out)
    print(f"soak: figures written to {path}")
    failed = [r["seed"] for r in per_seed if any(r[k] for k in FAILING)]
    if failed:
        print(
            f"soak: FAILED (wrong tokens, crashes or corrupt blocks): seeds {failed}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _soak(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, Any]:
    """One seed's soak, of the engine ``--engine`` names."""
    if args.engine == "vllm":
        from kvtier.soak.vllm import VllmSoak, VllmSoakOptions

        vllm = VllmSoakOptions(
            duration_s=args.duration,
            max_requests=args.max_requests,
            seed=seed,
            fault_interval_s=args.fault_interval,
        )
        figures = VllmSoak(vllm, workdir).run()
        # the reference engine's names, so one check and one summary serve both
        return {
            **figures,
            "engine_crashes": figures["server_crashes"],
            "engine_restarts": figures["server_restarts"],
            "corrupt_blocks_on_restart": 0,
        }
    from kvtier.soak.runner import SOAK_MODEL, Soak, SoakOptions, hybrid

    options = SoakOptions(
        duration_s=args.duration,
        max_requests=args.max_requests,
        seed=seed,
        fault_interval_s=args.fault_interval,
        model=SOAK_MODEL if args.sliding_window is None else hybrid(args.sliding_window),
    )
    return Soak(options, workdir).run()


def totals(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds' figures: the sums, the faults by kind, and each seed's figures."""
    faults: dict[str, int] = {}
    for r in per_seed:
        for kind, n in r["faults"].items():
            faults[kind] = faults.get(kind, 0) + n
    return {
        "seeds": len(per_seed),
        **{k: sum(r[k] for r in per_seed) for k in (*SUMMED, *FAILING)},
        "faults": faults,
        "failed_seeds": [r["seed"] for r in per_seed if any(r[k] for k in FAILING)],
        "per_seed": per_seed,
    }
