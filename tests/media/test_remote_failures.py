"""RemoteStore when Redis dies, hangs or restarts: calls fail (fast while backing off),
the store says it is unhealthy, and it recovers by itself once the backoff expires.

The breaker's clock is injected, so "after the backoff" is a step of the test, not a
sleep; nothing here asserts on time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import TransferError
from kvtier.media.circuit_breaker import Backoff, CircuitBreaker, Health
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore

from ..fake_clock import Clock
from ..redis_server import RedisServer

FP = b"\x44" * 32
BLOCK = 32 * 1024


def key(i: int) -> bytes:
    return bytes([i]) * 32


def data(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(server: RedisServer, clock: Clock) -> Iterator[RemoteStore]:
    breaker = CircuitBreaker(Backoff(base_s=1.0, max_s=8.0, jitter=0.0), clock=clock)
    s = RemoteStore.open(
        FP, RemoteOptions(url=server.url, timeout_s=0.5), breaker=breaker, environ={}
    )
    yield s
    s.close()


def test_killed_redis_fails_then_fails_fast(store: RemoteStore, server: RedisServer) -> None:
    store.write_many([key(1)], [data(1)])
    server.kill()
    with pytest.raises(TransferError, match="remote store failed"):
        store.write_many([key(2)], [data(2)])
    assert not store.healthy and store.breaker.state is Health.UNHEALTHY
    out = np.full(BLOCK, 7, np.uint8)
    for call in (
        lambda: store.write_many([key(3)], [data(3)]),
        lambda: store.read_many_into([key(1)], [out]),
        lambda: store.exists_many([key(1)]),
        lambda: store.delete_many([key(1)]),
    ):
        with pytest.raises(TransferError, match="unhealthy"):  # not contacted at all
            call()
    assert not out.any()  # a failed read leaves no plausible bytes
    assert not store.ping()


def test_restarted_redis_is_found_again_after_the_backoff(
    store: RemoteStore, server: RedisServer, clock: Clock
) -> None:
    store.write_many([key(1)], [data(1)])
    server.kill()
    assert not store.ping()
    assert not store.ping()  # still backing off: no probe
    clock.now += 1.0
    assert not store.ping()  # the probe finds it still down: wait doubles
    assert store.breaker.failures == 2 and store.breaker.retry_in() == 2.0
    server.start()  # same port, empty
    with pytest.raises(TransferError, match="unhealthy"):
        store.exists_many([key(1)])
    clock.now += 2.0
    assert store.exists_many([key(1)]) == [False]  # the probe: an empty Redis, a miss
    assert store.healthy
    out = np.empty(BLOCK, np.uint8)
    assert store.read_many_into([key(1)], [out]) == [ReadOutcome.MISS]
    store.write_many([key(1)], [data(1)])
    assert store.read_many_into([key(1)], [out]) == [ReadOutcome.HIT]
    assert np.array_equal(out, data(1))


def test_hung_redis_times_out_and_recovers(
    store: RemoteStore, server: RedisServer, clock: Clock
) -> None:
    store.write_many([key(1)], [data(1)])
    server.pause()
    out = np.empty(BLOCK, np.uint8)
    with pytest.raises(TransferError, match=r"(?i)timeout|timed out"):
        store.read_many_into([key(1)], [out])
    assert not store.healthy
    server.resume()
    clock.now += 1.0
    assert store.read_many_into([key(1)], [out]) == [ReadOutcome.HIT]
    assert np.array_equal(out, data(1)) and store.healthy


@pytest.mark.parametrize("state", ["down", "hung"])
def test_a_store_opens_while_redis_is_down_or_hung_and_finds_it_once_it_answers(
    tmp_path: Path, clock: Clock, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``open`` tries the server once: down (nothing listens) or hung (SIGSTOP: the
    connection is accepted, nothing answers), the store opens unhealthy, says so in
    one warning, fails fast until the backoff ends, then finds the server."""
    server = RedisServer(tmp_path)
    if state == "hung":
        server.start()
        server.pause()
    breaker = CircuitBreaker(Backoff(base_s=1.0, max_s=8.0, jitter=0.0), clock=clock)
    options = RemoteOptions(url=server.url, timeout_s=0.5)
    try:
        store = RemoteStore.open(FP, options, breaker=breaker, environ={})
        assert not store.healthy and store.outages == 1
        (warning,) = [r for r in caplog.records if r.name == "kvtier.media.remote"]
        assert "did not answer at start" in warning.getMessage()
        with pytest.raises(TransferError, match="unhealthy"):
            store.exists_many([key(1)])
        if state == "hung":
            server.resume()
        else:
            server.start()
        clock.now += 1.0
        assert store.exists_many([key(1)]) == [False] and store.healthy
        store.close()
    finally:
        server.stop()
