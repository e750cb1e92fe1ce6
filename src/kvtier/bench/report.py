"""Timing helpers of the benchmarks. Their results are written by ``kvtier.results``.

``git_commit`` and ``machine_info`` are ``kvtier.results``'s, named here too for the
benchmark scripts that import them from this module.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from kvtier.results import git_commit, machine_info

__all__ = ["git_commit", "machine_info", "median_time"]


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
