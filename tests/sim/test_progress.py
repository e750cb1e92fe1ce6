"""The progress bar draws only when enabled, and ends its line."""

from __future__ import annotations

import io

from kvtier.sim.progress import Progress


def test_draws_when_enabled() -> None:
    stream = io.StringIO()
    bar = Progress(128, stream=stream, enabled=True, delay_s=0.0)
    bar.advance(64)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r[") and "64/128 requests" in text and text.endswith("\n")


def test_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    bar = Progress(10, stream=stream, delay_s=0.0)
    bar.advance(10)
    bar.close()
    assert stream.getvalue() == ""
