"""Health of a remote store: a small circuit breaker with capped, jittered backoff.

Runs on the worker side (and wherever a ``RemoteStore`` is used), in any thread: every
method takes one lock. Pure Python; the clock and the random source are injected so
that tests drive time by hand. In a forked child (``os.fork``) every breaker gets a new
lock (another thread of the parent may have held the old one at the fork, and never
releases it in the child), and a breaker that was ``PROBING`` is ``UNHEALTHY`` with its
retry due at once: the probe in flight belonged to a parent thread the child does not
have, so the child probes for itself.

::

                 failure                        backoff expired: allow() lets ONE probe
    HEALTHY ─────────────────► UNHEALTHY ───────────────────────────────► PROBING
       ▲                        ▲   (allow() False: fail fast)              │
       │                        └──────────────── probe failed ─────────────┤
       └────────────────────────── any success ─────────────────────────────┘

After the ``n``-th consecutive failure the store is left alone for
``min(max_s, base_s * 2**(n-1))`` seconds, shortened by up to ``jitter`` of itself at
random, so that many engines that lost the same Redis do not all probe it in the same
instant. Failures reported while already unhealthy (operations that were in flight
when the store went down) neither extend nor grow the backoff: one outage counts once.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.media.forks import renew_after_fork


class Health(str, enum.Enum):
    """Where a ``CircuitBreaker`` stands."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long an unhealthy store is left alone.

    Attributes:
        base_s: wait after the first failure, in seconds.
        max_s: the cap on any wait.
        jitter: fraction (0..1) of each wait that is randomly taken off it.
    """

    base_s: float = 0.5
    max_s: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError(f"need 0 < base_s <= max_s, got {self.base_s} and {self.max_s}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay(self, failures: int, draw: float) -> float:
        """The wait after ``failures`` (>= 1) consecutive failures; ``draw`` in [0, 1)."""
        full = min(self.max_s, self.base_s * 2.0 ** min(failures - 1, 63))
        return full * (1.0 - self.jitter * draw)


class CircuitBreaker:
    """Decides whether a store may be contacted now. See the module docstring.

    Args:
        backoff: the backoff schedule.
        clock: monotonic seconds (``time.monotonic`` unless a test injects one).
        rng: source of jitter draws in [0, 1) (``random.random`` unless injected).
    """

    def __init__(
        self,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.backoff = backoff or Backoff()
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._state = Health.HEALTHY
        self._failures = 0
        self._outages = 0
        self._retry_at = 0.0
        self._last_error: str | None = None
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock; a probe in flight (a parent thread's, gone)
        is abandoned, its retry due now, so the child's next ``allow`` probes."""
        self._lock = threading.Lock()
        if self._state is Health.PROBING:
            self._state = Health.UNHEALTHY
            self._retry_at = float("-inf")

    @property
    def state(self) -> Health:
        """The state now (an expired backoff still reads ``UNHEALTHY`` until ``allow``)."""
        return self._state

    @property
    def failures(self) -> int:
        """Consecutive failures (0 when healthy)."""
        return self._failures

    @property
    def outages(self) -> int:
        """Outages so far: failures that found the store healthy. A store back from
        an outage may have restarted empty, so what was known of it is stale."""
        return self._outages

    @property
    def last_error(self) -> str | None:
        """What the last failure was (kept until a success)."""
        return self._last_error

    def retry_in(self) -> float:
        """Seconds until a probe is allowed (0.0 when it is allowed now)."""
        with self._lock:
            if self._state is not Health.UNHEALTHY:
                return 0.0
            return max(0.0, self._retry_at - self._clock())

    def allow(self) -> bool:
        """Whether the caller may contact the store now; never blocks.

        ``True`` when healthy; once the backoff has expired, ``True`` for exactly one
        caller (the probe), which must then report ``record_success`` or
        ``record_failure``. ``False`` otherwise: fail fast.
        """
        with self._lock:
            if self._state is Health.HEALTHY:
                return True
            if self._state is Health.UNHEALTHY and self._clock() >= self._retry_at:
                self._state = Health.PROBING
                return True
            return False

    def record_success(self) -> None:
        """The store answered: healthy again, the backoff starts over."""
        with self._lock:
            self._state = Health.HEALTHY
            self._failures = 0
            self._last_error = None

    def record_failure(self, error: str) -> None:
        """The store failed (error or timeout): unhealthy until the next backoff expires."""
        with self._lock:
            self._last_error = error
            if self._state is Health.UNHEALTHY:
                return  # an operation of the same outage, in flight when it began
            if self._state is Health.HEALTHY:
                self._outages += 1
            self._failures += 1
            self._state = Health.UNHEALTHY
            self._retry_at = self._clock() + self.backoff.delay(self._failures, self._rng())
