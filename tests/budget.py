"""How many Hypothesis examples a property test runs, under the active profile."""

from __future__ import annotations

from hypothesis import settings


def examples(n: int) -> int:
    """``n`` normally; a tenth (at least 10) under the ``mutation`` profile (conftest)."""
    return n if settings.default.max_examples >= 100 else max(10, n // 10)
