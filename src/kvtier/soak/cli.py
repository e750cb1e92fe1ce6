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

from kvtier.errors import ConfigError
from kvtier.results import add_json_option, check_output, default_path, write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of serving")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="stop after N")
    parser.add_argument("--seed", type=int, default=0, help="seeds workload and faults")
    parser.add_argument(
        "--fault-interval", type=float, default=4.0, help="mean seconds between faults"
    )
    add_json_option(parser, "soak")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )


def main(args: argparse.Namespace) -> int:
    from kvtier.soak.runner import Soak, SoakOptions

    for key, value in (
        ("--duration", args.duration),
        ("--max-requests", args.max_requests),
        ("--fault-interval", args.fault_interval),
    ):
        if not value > 0:
            raise ConfigError(key, f"must be positive, got {value}")
    out = check_output("--json", args.json or default_path("soak"))
    options = SoakOptions(
        duration_s=args.duration,
        max_requests=args.max_requests,
        seed=args.seed,
        fault_interval_s=args.fault_interval,
    )
    with tempfile.TemporaryDirectory(prefix="kvtier-soak-", dir=args.workdir) as tmp:
        figures = Soak(options, Path(tmp)).run()
    print(json.dumps(figures, indent=2))
    config = {
        "duration_s": options.duration_s,
        "max_requests": options.max_requests,
        "seed": options.seed,
        "fault_interval_s": options.fault_interval_s,
    }
    path = write_result("soak", config, figures, out)
    print(f"soak: figures written to {path}")
    failed = figures["wrong_tokens"] or figures["engine_crashes"]
    failed = failed or figures["corrupt_blocks_on_restart"] or figures["corrupt_blocks_at_end"]
    if failed:
        print("soak: FAILED (wrong tokens, crashes or corrupt blocks)", file=sys.stderr)
    return 1 if failed else 0
