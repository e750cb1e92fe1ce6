"""The ``kvtier`` command: tiered KV-cache offloading for LLM inference.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``main(args) -> int``; this file lists them, so that ``kvtier --help`` stays fast
(modules, and torch, are imported only for the subcommand that runs), and it is the
one place where errors end: a bad option or a ``KvtierError`` is one line on stderr
and exit 2, an ``OSError`` one line and exit 1, Ctrl-C one line and exit 130, SIGTERM
one line and exit 143 -- each after the command's ``finally`` blocks have run (so a
run's temporary directory is removed). Never a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from kvtier.errors import KvtierError
from kvtier.interrupts import raise_or_defer

DESCRIPTION = """\
Tiered KV-cache offloading for LLM inference: KV blocks out of GPU memory to CPU
memory, local disk and a shared Redis/Valkey store, and back when a later request
shares the prefix.

Start with `kvtier run` (the main job: multi-turn chat with and without offloading).
Each command writes its results to kvtier-results/ unless --json says otherwise.
`kvtier COMMAND --help` lists a command's options; docs/ explains each command.
"""

# name -> (module, one-line help). Nested groups (``bench``) map to a dict.
COMMANDS: dict[str, tuple[str, str] | dict[str, tuple[str, str]]] = {
    "run": ("kvtier.run.cli", "the main job: multi-turn chat TTFT with and without offloading"),
    "simulate": ("kvtier.sim.cli", "replay a trace through the manager; compare with Belady"),
    "bench": {
        "manager": ("kvtier.bench.manager", "per-block cost of the scheduler-side manager"),
        "transfer": ("kvtier.bench.transfer", "GPU<->CPU handler bandwidth against a plain copy"),
        "disk": ("kvtier.bench.disk", "disk tier store/load GB/s against dd, side by side"),
        "remote": ("kvtier.bench.remote", "remote tier store/load GB/s against redis-benchmark"),
        "vllm": (
            "kvtier.bench.vllm",
            "a served chat through vLLM's OpenAI server, with and without kvtier",
        ),
    },
    "soak": ("kvtier.soak.cli", "the engine under random tier faults; every token checked"),
}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written; adds ``(default: X)`` where help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``kvtier run: error: ...``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C, so ``finally`` blocks clean up."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Unwind once: once the exception is raised, later Ctrl-C or SIGTERM are ignored
    while ``finally`` blocks clean up (and can no longer raise after the error line,
    which would end in a traceback). Inside a ``kvtier.interrupts.critical`` section (a
    hand-over between the connector's halves) the exception waits for the section's
    end; a second signal meanwhile raises at once."""
    stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated()
    raise_or_defer(stop, before_raise=_ignore_stop_signals)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _add_command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    module: str,
    help_: str,
) -> None:
    mod = importlib.import_module(module)
    description = (mod.__doc__ or help_).split("\n\n")[0].replace("``", "`")
    parser = sub.add_parser(name, help=help_, description=description)
    mod.add_arguments(parser)
    parser.set_defaults(_main=mod.main)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the module of the subcommand named in argv."""
    parser = Parser(prog="kvtier", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [a for a in argv if not a.startswith("-")][:2]
    for name, entry in COMMANDS.items():
        if isinstance(entry, dict):
            group = sub.add_parser(name, help=f"benchmarks: {', '.join(entry)}")
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
    """Entry point of the ``kvtier`` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    run = getattr(args, "_main", None)
    if run is None:
        group = COMMANDS.get(args.command or "")
        if not isinstance(group, dict):
            parser.print_help()
            return 2
        return _fail(f"kvtier {args.command}", f"error: name one of {', '.join(group)}", 2)
    prog = " ".join(["kvtier", args.command, *([args.subcommand] if "subcommand" in args else [])])
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS} if in_main_thread else {}
    try:
        return int(run(args))
    except KvtierError as e:
        return _fail(prog, f"error: {e}", 2)
    except OSError as e:
        return _fail(prog, f"error: {e}", 1)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", 130)
    except Terminated:
        return _fail(prog, "terminated", 143)
    finally:
        if previous and signal.getsignal(signal.SIGINT) is _on_signal:  # not stopped
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _fail(prog: str, message: str, status: int) -> int:
    sys.stdout.flush()
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def console() -> None:
    """The ``kvtier`` console script (and ``python -m kvtier``): exit with ``main``'s status.

    After Ctrl-C or SIGTERM (whose ``finally`` blocks have run) the interpreter is left
    without finalizing it: CPython turns a Ctrl-C that passed through some C extension
    code (pybind11's eval, in torch) into death by SIGINT at exit even when it was
    handled, and joins threads a stopped run may have left -- the status would vary.
    """
    status = main()
    if status in (130, 143):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    console()
