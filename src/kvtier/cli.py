"""The ``kvtier`` command.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``main(args) -> int``; this file only lists them, so that ``kvtier --help`` stays
fast (modules, and torch, are imported only for the subcommand that runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Nested groups (``bench``) map to a dict.
COMMANDS: dict[str, tuple[str, str] | dict[str, tuple[str, str]]] = {
    "run": ("kvtier.run.cli", "the main job: multi-turn chat TTFT with and without offloading"),
    "bench": {
        "manager": ("kvtier.bench.manager", "per-block cost of the scheduler-side manager"),
        "transfer": ("kvtier.bench.transfer", "GPU<->CPU handler bandwidth against a plain copy"),
        "disk": ("kvtier.bench.disk", "disk tier store/load GB/s against dd, side by side"),
        "remote": ("kvtier.bench.remote", "remote tier store/load GB/s against redis-benchmark"),
    },
    "simulate": ("kvtier.sim.cli", "replay a trace through the manager; compare with Belady"),
    "soak": ("kvtier.soak.cli", "the engine under random tier faults; every token checked"),
}


def _add_command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    module: str,
    help_: str,
) -> None:
    parser = sub.add_parser(name, help=help_, description=help_)
    mod = importlib.import_module(module)
    mod.add_arguments(parser)
    parser.set_defaults(_main=mod.main)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the module of the subcommand named in argv."""
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [a for a in argv if not a.startswith("-")][:2]
    for name, entry in COMMANDS.items():
        if isinstance(entry, dict):
            group = sub.add_parser(name, help=f"{name} subcommands")
            gsub = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
            for sname, (module, help_) in entry.items():
                if wanted[:2] == [name, sname]:
                    _add_command(gsub, sname, module, help_)
                else:
                    gsub.add_parser(sname, help=help_)
        else:
            module, help_ = entry
            if wanted[:1] == [name]:
                _add_command(sub, name, module, help_)
            else:
                sub.add_parser(name, help=help_)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvtier`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    run = getattr(args, "_main", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args))


if __name__ == "__main__":
    sys.exit(main())
