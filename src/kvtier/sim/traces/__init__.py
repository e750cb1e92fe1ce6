"""Workload traces shipped inside the package (provenance and license: ``SOURCES.md``)."""

from __future__ import annotations

from pathlib import Path

SYNTHETIC_TRACE = Path(__file__).resolve().parent / "synthetic_trace.jsonl"
"""Mooncake's synthetic trace (Apache-2.0), byte for byte; the simulator's default."""

SYNTHETIC_TRACE_SHA256 = "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"
"""Its SHA-256, as published in the origin's record of it (``SOURCES.md``)."""
