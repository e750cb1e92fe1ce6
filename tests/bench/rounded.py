"""Checks of a benchmark's JSON figures, which are rounded to 3 decimals."""

from __future__ import annotations

import statistics
from typing import Any

HALF = 0.0005  # every figure in the JSON is rounded to 3 decimals


def assert_sealed_rows(rows: list[dict[str, Any]], size: int, repeats: int) -> None:
    """The sealed-beside-plain rows of ``kvtier bench disk`` / ``remote``: a store and a
    load, each median and quotient the JSON's own runs give."""
    assert [(r["op"], r["block_bytes"]) for r in rows] == [("store", size), ("load", size)]
    for r in rows:
        plain, sealed = r["plain_gbps_runs"], r["sealed_gbps_runs"]
        assert len(plain) == len(sealed) == len(r["sealed_to_plain_runs"]) == repeats
        assert r["plain_gbps"] == statistics.median(plain)
        assert r["sealed_gbps"] == statistics.median(sealed)
        for got, p, s in zip(r["sealed_to_plain_runs"], plain, sealed, strict=True):
            assert_rounded_quotient(got, s, p)
        assert_rounded_quotient(r["sealed_to_plain"], r["sealed_gbps"], r["plain_gbps"])


def assert_rounded_quotient(got: float, top: float, bottom: float, top_error: int = 1) -> None:
    """``got`` is round(a / b, 3) for some a within ``top_error`` half-units of ``top``
    and some b within one of ``bottom``: the exact interval, so a wrong formula fails while
    the rounding of the JSON's own inputs never does."""
    lo = max(0.0, top - top_error * HALF) / (bottom + HALF)
    hi = (top + top_error * HALF) / (bottom - HALF)
    assert lo - HALF - 1e-12 <= got <= hi + HALF + 1e-12, (got, lo, hi)
