"""A progress bar on stderr for long replays; silent for short ones and non-terminals.

Runs in the ``kvtier simulate`` process. It draws nothing during the first second
(short runs stay quiet), redraws at most five times a second, and only when the
stream is a terminal unless told otherwise, so logs and tests see no carriage
returns. Cost per :meth:`Progress.advance` is one integer add and a comparison.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


class Progress:
    """Counts units of work (requests) and draws ``[####....] 42% 1700/4000 label``.

    Args:
        total: units expected in all (several replays can share one bar).
        label: what is being counted, shown after the figures.
        stream: where to draw; stderr by default.
        enabled: draw at all; by default only when ``stream`` is a terminal.
        delay_s: draw nothing until this much time has passed.
    """

    __slots__ = (
        "_check_at",
        "_done",
        "_drawn",
        "_enabled",
        "_label",
        "_next_draw",
        "_stream",
        "_total",
    )

    def __init__(
        self,
        total: int,
        label: str = "requests",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay_s: float = 1.0,
    ) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._total = max(total, 1)
        self._label = label
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._done = 0
        self._drawn = False
        self._next_draw = time.monotonic() + delay_s
        self._check_at = 64 if self._enabled else 1 << 62

    def advance(self, units: int = 1) -> None:
        """Count ``units`` more units done; redraw if due."""
        self._done += units
        if self._done >= self._check_at:
            self._check_at = self._done + 64
            now = time.monotonic()
            if now >= self._next_draw:
                self._next_draw = now + 0.2
                self._draw()

    def close(self) -> None:
        """Finish the line, if anything was drawn."""
        if self._drawn:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()
        self._drawn = False

    def _draw(self) -> None:
        share = min(self._done / self._total, 1.0)
        filled = int(share * _WIDTH)
        self._drawn = True
        bar = "#" * filled + "." * (_WIDTH - filled)
        self._stream.write(f"\r[{bar}] {share:4.0%} {self._done}/{self._total} {self._label}")
        self._stream.flush()
