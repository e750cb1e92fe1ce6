"""A clock the test moves by hand (``clock.now = ...``), for circuit breakers and stores."""

from __future__ import annotations


class Clock:
    """Returns ``now`` when called; starts at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
