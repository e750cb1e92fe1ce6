"""Where benchmark results go: JSON under ``benchmarks/results/`` with their context.

Every result file records the machine, the commit and the configuration, so that a
figure quoted in a note can be traced to the run that produced it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def git_commit() -> str:
    """The current commit (with ``+dirty`` when the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    """Platform, CPU count and Python; torch and CUDA device when torch is loaded."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import torch
    except ImportError:
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


def default_path(name: str) -> Path:
    """``benchmarks/results/<name>-<host>-<UTC time>.json``."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = platform.node().split(".")[0] or "host"
    return Path("benchmarks") / "results" / f"{name}-{host}-{stamp}.json"


def write_result(name: str, config: dict[str, Any], results: Any, path: Path | None = None) -> Path:
    """Write one benchmark's results with machine, commit, time and configuration."""
    path = path or default_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "config": config,
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def median_time(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time of ``fn()`` in seconds by ``clock``, after ``warmup`` untimed calls.

    The default clock is wall time. ``time.thread_time`` counts only the CPU time of
    the calling thread: on a shared machine, single-threaded code is then measured
    without the time it spent waiting for a core.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)
