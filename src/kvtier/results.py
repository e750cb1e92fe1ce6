"""Where results go, and the one writer every command uses (``run``, ``simulate``, ``bench``).

Runs in the command's process; pure Python. A user's results go to
``./kvtier-results/<command>-<host>-<UTC time>.json`` unless ``--json PATH`` says
otherwise; the reference results committed with kvtier live in ``benchmarks/results/``
and are only ever written there on purpose (``--json benchmarks/results/...``).

Results are never overwritten: a default name that exists gets ``-2``, ``-3``, ...; a
path given with ``--json`` that exists is refused before the command does any work
(``check_output``), and the file is created exclusively when written. Every file
records the command, the time, kvtier's commit, the machine and the configuration, so
that a figure quoted anywhere can be traced to the run that produced it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

RESULTS_DIR = Path("kvtier-results")
"""The default directory of a user's results, relative to the working directory."""

_SOURCE_DIR = Path(__file__).resolve().parent


def add_json_option(parser: argparse._ActionsContainer, command: str) -> None:
    """Add the ``--json PATH`` option every command shares."""
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="results file, never overwritten "
        f"(default: {RESULTS_DIR}/{command}-<host>-<time>.json)",
    )


def default_path(command: str, suffix: str = ".json") -> Path:
    """A fresh ``kvtier-results/<command>-<host>-<UTC time><suffix>`` (``-2``... if taken)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = platform.node().split(".")[0] or "host"
    stem = f"{command}-{host}-{stamp}"
    path = RESULTS_DIR / f"{stem}{suffix}"
    n = 2
    while path.exists():
        path = RESULTS_DIR / f"{stem}-{n}{suffix}"
        n += 1
    return path


def check_output(option: str, path: Path) -> Path:
    """Make sure ``path`` can be written, before any work: it is new and its folder writable.

    Creates the missing parent folders (as the write would).

    Raises:
        ConfigError: naming ``option``, when the file exists or cannot be created.
    """
    if path.exists() or path.is_symlink():
        raise ConfigError(
            option, f"{path} exists; results are never overwritten: give a new path or remove it"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x"):
            pass
        path.unlink()
    except OSError as e:
        raise ConfigError(
            option, f"cannot write {path} ({e.strerror or e}); give a path in a writable folder"
        ) from None
    return path


def git_commit() -> str:
    """kvtier's commit (``+dirty`` with uncommitted changes), or ``unknown`` outside git.

    Asked of the repository kvtier's source lives in, not the working directory.
    """
    try:
        sha, dirty = (
            subprocess.run(
                ["git", "-C", str(_SOURCE_DIR), *cmd],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
            for cmd in (["rev-parse", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    """Platform, CPU model and count, Python; torch and CUDA device when torch is loaded."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is None:
        return info
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_result(
    command: str,
    config: dict[str, Any],
    results: Any,
    path: Path | None = None,
    machine: dict[str, Any] | None = None,
    commit: str | None = None,
) -> Path:
    """Write one command's results with time, commit, machine and configuration.

    Args:
        command: ``run``, ``simulate``, ``disk``, ... (the file's ``benchmark`` field).
        config: everything needed to run it again.
        results: the figures (JSON-serialisable).
        path: where; ``None``: a fresh ``default_path(command)``.
        machine: the machine description (default: ``machine_info()``).
        commit: the code the figures came from, read when the run started (default:
            ``git_commit()`` now; a long run should pass what it read at its start).

    Raises:
        FileExistsError: ``path`` exists (results are never overwritten).
    """
    path = path or default_path(command)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": command,
        "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit or git_commit(),
        "machine": machine or machine_info(),
        "config": config,
        "results": results,
    }
    with open(path, "x", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    return path
