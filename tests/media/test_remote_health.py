"""CircuitBreaker: the state machine and its backoff, driven by an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.media.circuit_breaker import Backoff, CircuitBreaker, Health

from ..fake_clock import Clock


def breaker(draw: float = 0.0, **kw: float) -> tuple[CircuitBreaker, Clock]:
    clock = Clock(100.0)
    return CircuitBreaker(Backoff(**kw), clock=clock, rng=lambda: draw), clock


def test_healthy_allows_everything() -> None:
    b, _ = breaker()
    assert b.state is Health.HEALTHY
    assert all(b.allow() for _ in range(5))
    assert b.retry_in() == 0.0


def test_failure_fails_fast_until_the_backoff_expires_then_allows_one_probe() -> None:
    b, clock = breaker(base_s=1.0, max_s=8.0, jitter=0.0)
    b.record_failure("ConnectionError")
    assert b.state is Health.UNHEALTHY and b.last_error == "ConnectionError"
    assert not b.allow()
    assert b.retry_in() == pytest.approx(1.0)
    clock.now += 0.999
    assert not b.allow()
    clock.now += 0.001
    assert b.allow()  # the probe
    assert b.state is Health.PROBING
    assert not b.allow()  # one probe at a time
    b.record_success()
    assert b.state is Health.HEALTHY and b.failures == 0 and b.last_error is None
    assert b.allow()


def test_backoff_doubles_per_failed_probe_up_to_the_cap() -> None:
    b, clock = breaker(base_s=1.0, max_s=8.0, jitter=0.0)
    waits = []
    for _ in range(6):
        b.record_failure("timeout")
        waits.append(b.retry_in())
        clock.now += waits[-1]
        assert b.allow()
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert b.failures == 6


def test_failures_of_one_outage_count_once() -> None:
    b, _ = breaker(base_s=1.0, max_s=8.0, jitter=0.0)
    for _ in range(10):  # operations in flight when the store went down
        b.record_failure("ConnectionError")
    assert b.failures == 1 and b.retry_in() == 1.0


def test_an_outage_is_counted_once_however_many_probes_fail() -> None:
    # The tiering forgets what it knew of a shared store after each outage.
    b, clock = breaker(base_s=1.0, max_s=8.0, jitter=0.0)
    assert b.outages == 0
    for _ in range(3):  # one outage: the first failure, then failed probes
        b.record_failure("ConnectionError")
        clock.now += b.retry_in()
        assert b.allow()
    b.record_success()
    assert b.outages == 1
    b.record_failure("timeout")
    assert b.outages == 2


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999])
def test_jitter_only_shortens_the_wait(draw: float) -> None:
    b, _ = breaker(draw, base_s=2.0, max_s=8.0, jitter=0.5)
    b.record_failure("x")
    assert b.retry_in() == pytest.approx(2.0 * (1 - 0.5 * draw))


def test_bad_backoff_is_refused() -> None:
    for kw in ({"base_s": 0.0}, {"base_s": 2.0, "max_s": 1.0}, {"jitter": 1.5}):
        with pytest.raises(ValueError):
            Backoff(**kw)


class BreakerMachine(RuleBasedStateMachine):
    """The breaker against a plain model: one probe per expired backoff, waits within
    ``[(1 - jitter) * d, d]`` for ``d = min(max, base * 2**(n-1))``."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(100.0)
        self.draw = 0.0
        self.backoff = Backoff(base_s=0.5, max_s=4.0, jitter=0.5)
        self.b = CircuitBreaker(self.backoff, clock=self.clock, rng=lambda: self.draw)
        self.state = Health.HEALTHY
        self.failures = 0
        self.retry_at = 0.0

    @rule(seconds=st.floats(0, 10))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(draw=st.floats(0, 0.999))
    def set_draw(self, draw: float) -> None:
        self.draw = draw

    @rule()
    def allow(self) -> None:
        expected = self.state is Health.HEALTHY or (
            self.state is Health.UNHEALTHY and self.clock.now >= self.retry_at
        )
        assert self.b.allow() == expected
        if expected and self.state is Health.UNHEALTHY:
            self.state = Health.PROBING

    @precondition(lambda self: self.state is not Health.UNHEALTHY)
    @rule()
    def success(self) -> None:
        self.b.record_success()
        self.state, self.failures = Health.HEALTHY, 0

    @rule()
    def failure(self) -> None:
        self.b.record_failure("err")
        if self.state is not Health.UNHEALTHY:
            self.failures += 1
            full = min(self.backoff.max_s, self.backoff.base_s * 2.0 ** (self.failures - 1))
            wait = full * (1.0 - self.backoff.jitter * self.draw)
            assert (1 - self.backoff.jitter) * full <= wait <= full
            assert self.b.retry_in() == pytest.approx(wait)
            self.retry_at = self.clock.now + wait
            self.state = Health.UNHEALTHY

    @invariant()
    def agrees(self) -> None:
        assert self.b.state is self.state
        assert self.b.failures == self.failures


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
