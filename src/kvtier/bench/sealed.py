"""What sealing costs a tier: the same passes with and without an encryption key, side
by side, for ``kvtier bench disk`` and ``kvtier bench remote``.

Runs in the benchmark's process. For each size, a benchmark opens two stores of one
kind, one plain and one sealed with a fresh random key (``SealedCodec``: AES-256-GCM),
each behind its own handlers and its own CPU pages of the same bytes, and hands
``side_by_side`` one pass of each (a callable that stores, or loads, every block
once). Passes alternate, in pairs whose order swaps each repeat (plain, sealed, sealed,
plain, ...), so drift on a shared machine and whatever one pass leaves for the next hit
both alike; the first pair is a warm-up, not timed. Reported per operation: the median
GB/s (10^9 payload bytes per second) of each, ``sealed_to_plain`` (median sealed over
median plain) and the per-repeat quotients beside it (``sealed_to_plain_runs``).

The aim is ``sealed_to_plain >= 0.8`` at 256 KiB blocks: AES-GCM runs at several GB/s
per core with AES-NI and ``cryptography`` releases the GIL while it runs, so the I/O
threads seal and open in parallel.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtier.key_file import EncryptionKey

DEFAULT_SIZES = "256KiB"


def bench_keys() -> tuple[EncryptionKey, ...]:
    """A fresh random key (the benchmark's sealed store; never written anywhere)."""
    return (EncryptionKey.of(os.urandom(32)),)


@dataclass(frozen=True, slots=True)
class Passes:
    """One operation at one size: a pass of the plain store and one of the sealed.

    Attributes:
        op: ``"store"`` or ``"load"``.
        size: payload bytes per block.
        nbytes: payload bytes one pass moves.
        plain: runs one pass on the plain store.
        sealed: runs one pass on the sealed store (the same blocks and bytes).
        setup: runs untimed before every pass, given whether the sealed store's is
            next (fresh keys, a cold cache).
    """

    op: str
    size: int
    nbytes: int
    plain: Callable[[], object]
    sealed: Callable[[], object]
    setup: Callable[[bool], object] = lambda sealed: None


def side_by_side(passes: Passes, repeats: int) -> dict[str, Any]:
    """Alternate plain and sealed passes ``repeats`` times after one warm-up each; the
    row of medians and quotients (rounded to 3 decimals)."""
    runs: tuple[list[float], list[float]] = ([], [])
    both = ((False, passes.plain, runs[0]), (True, passes.sealed, runs[1]))
    for i in range(repeats + 1):
        # plain first in even repeats, sealed first in odd ones: whatever the first pass
        # of a pair pays (or leaves warm for the second) falls on each alike
        for is_sealed, run, out in both if i % 2 == 0 else both[::-1]:
            passes.setup(is_sealed)
            t0 = time.perf_counter()
            run()
            if i:
                out.append(passes.nbytes / (time.perf_counter() - t0) / 1e9)
    plain, sealed = (statistics.median(r) for r in runs)
    return {
        "op": passes.op,
        "compare": "sealed/plain",
        "block_bytes": passes.size,
        "plain_gbps": round(plain, 3),
        "sealed_gbps": round(sealed, 3),
        "sealed_to_plain": round(sealed / plain, 3),
        "sealed_to_plain_runs": [round(s / p, 3) for p, s in zip(*runs, strict=True)],
        "plain_gbps_runs": [round(x, 3) for x in runs[0]],
        "sealed_gbps_runs": [round(x, 3) for x in runs[1]],
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table."""
    print(f"{'op':6} {'block':>8} {'plain GB/s':>11} {'sealed GB/s':>12} {'sealed/plain':>13}")
    for r in rows:
        runs = r["sealed_to_plain_runs"]
        print(
            f"{r['op']:6} {r['block_bytes'] // 1024:>6}Ki {r['plain_gbps']:>11.3f} "
            f"{r['sealed_gbps']:>12.3f} {r['sealed_to_plain']:>13.2f}  "
            f"(runs {min(runs):.2f}-{max(runs):.2f})"
        )


def summary(rows: list[dict[str, Any]]) -> str:
    """One clause for the benchmark's summary line."""
    if not rows:
        return "sealing not measured"
    shown = ", ".join(
        f"{r['op']} {r['block_bytes'] // 1024} KiB {r['sealed_to_plain']:.2f}" for r in rows
    )
    return f"sealed/plain {shown}"
