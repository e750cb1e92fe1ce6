"""``RecordingGuard``: metrics and events that cannot be recorded never stop the engine.

Runs in the engine's thread. Recording is a side effect of serving: a metrics backend
that raises (a counter given a value it refuses, a registry in a bad state), a KV-event
publisher that fails, or a bug in kvtier's own bookkeeping of them must cost the
record, never a request. Every recording call of the observer goes through ``run``:
an exception is counted, logged once per ``(what, exception type)`` with its
traceback, and the engine's step goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RecordingGuard:
    """Counts and logs (once per kind) the recording calls that raised."""

    def __init__(self) -> None:
        self.failures = 0  # recording calls that raised, since the engine started
        self._logged: set[tuple[str, type[BaseException]]] = set()

    def run(self, what: str, fn: Callable[[], T], fallback: T) -> T:
        """``fn()``, or ``fallback`` when it raises ``Exception`` (counted, logged once).

        Args:
            what: what was being recorded, for the log line (``"metrics"``, ``"events"``).
            fn: the recording call.
            fallback: what to return when it fails.
        """
        try:
            return fn()
        except Exception as exc:
            self.failures += 1
            kind = (what, type(exc))
            if kind not in self._logged:
                self._logged.add(kind)
                logger.exception(
                    "kvtier: recording %s failed; the engine goes on without this record "
                    "(later failures of this kind are counted, not logged)",
                    what,
                )
            return fallback
