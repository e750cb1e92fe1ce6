"""Discovery: its bounds and defaults, its one background thread, a store that raises,
and waits that end (written for the survivors of mutation testing)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import pytest

from kvtier.blocks import Medium
from kvtier.errors import TransferError
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.discovery import Discovery, Found
from kvtier.scheduler.tiering import TieredManager

from .conftest import keys


class Gate:
    """A shared store whose checks wait for ``release`` and record what ran, where."""

    def __init__(self, held: Sequence[bytes] = (), raises: Exception | None = None) -> None:
        self.held = set(held)
        self.raises = raises
        self.outages = 0
        self.release = threading.Event()
        self.entered = threading.Event()
        self.started = 0
        self.finished = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        with self._lock:
            self.started += 1
            self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.release.wait(10)
        with self._lock:
            self.finished += 1
        if self.raises is not None:
            raise self.raises
        return [k in self.held for k in ks]


def test_at_most_four_checks_wait_by_default() -> None:
    store = Gate()
    d = Discovery(store)
    for i in range(6):
        d.ask(keys(i))
    assert (d.in_flight, d.dropped) == (4, 2)
    store.release.set()
    d.shutdown()


def test_checks_run_one_at_a_time_on_a_named_thread() -> None:
    store = Gate(held=keys(1))
    d = Discovery(store)
    d.ask(keys(1))
    d.ask(keys(2))
    assert store.entered.wait(30), "the first check never started"
    time.sleep(0.2)  # time for a wrong second check to start beside it
    assert store.started == 1, "the second check waits for the first"
    store.release.set()
    d.wait()
    assert store.started == 2
    assert len(store.threads) == 1
    (name,) = store.threads
    assert name.startswith("kvtier-discovery")
    assert d.answers() == [Found(tuple(keys(1)), 0)]
    d.shutdown()


def test_a_check_is_stalled_after_a_tenth_of_a_second_by_default() -> None:
    store = Gate()
    d = Discovery(store)
    d.ask(keys(1))
    time.sleep(0.3)
    assert d.stalled and not d.asking(keys(1)[0])
    store.release.set()
    d.wait()
    assert not d.stalled
    d.shutdown()


def test_an_adopted_answer_is_forgotten_by_the_stall_clock() -> None:
    store = Gate(held=keys(1))
    store.release.set()
    d = Discovery(store, stall_s=0.01)
    d.ask(keys(1, 2))
    d.wait()
    assert d.answers() == [Found(tuple(keys(1)), 0)]
    time.sleep(0.05)
    assert not d.stalled and d.in_flight == 0
    assert d.answers() == []
    d.shutdown()


def test_a_run_that_all_exists_is_found_whole_and_none_found_is_no_answer() -> None:
    store = Gate(held=keys(1, 2))
    store.release.set()
    d = Discovery(store)
    d.ask(keys(1, 2))
    d.ask(keys(3, 1))
    d.ask([])
    d.wait()
    assert d.answers() == [Found(tuple(keys(1, 2)), 0)]
    d.shutdown()


def test_the_outage_count_at_asking_time_travels_with_the_answer() -> None:
    store = Gate(held=keys(1))
    d = Discovery(store)
    store.outages = 3
    d.ask(keys(1))
    store.outages = 4
    store.release.set()
    d.wait()
    assert d.answers() == [Found(tuple(keys(1)), 3)]
    d.shutdown()


@pytest.mark.parametrize("error", [TransferError("down"), RuntimeError("a bug")])
def test_a_store_that_raises_gives_no_answer_and_no_error(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    store = Gate(held=keys(1), raises=error)
    store.release.set()
    d = Discovery(store)
    with caplog.at_level(logging.ERROR, logger="kvtier.scheduler.discovery"):
        d.ask(keys(1))
        d.wait()
        assert d.answers() == []
    logged = [r.getMessage() for r in caplog.records]
    if isinstance(error, TransferError):
        assert logged == [], "an unreachable store is expected, not logged"
    else:
        assert logged == ["shared-store existence check raised"]
    assert d.in_flight == 0
    d.shutdown()


@pytest.mark.parametrize("error", [TransferError("down"), RuntimeError("a bug")])
def test_a_check_that_raised_is_not_an_answer_the_store_stays_failing(error: Exception) -> None:
    """A store with an outage is failing until a check asked after it is answered; a
    check that raised, asked after the same outage, answers nothing."""
    store = Gate(held=keys(1), raises=error)
    store.outages = 1
    store.release.set()
    d = Discovery(store)
    assert d.failing
    d.ask(keys(1))
    d.wait()
    assert d.answers() == []
    assert d.failing  # still: no check was answered since the outage
    store.raises = None
    d.ask(keys(1))
    d.wait()
    assert d.answers() == [Found(tuple(keys(1)), 1)]
    assert not d.failing
    d.shutdown()


def test_waits_end_at_their_timeout() -> None:
    store = Gate()
    d = Discovery(store)
    d.ask(keys(1))
    t0 = time.monotonic()
    d.wait(0.05)
    remote = TierManager(
        medium=Medium.REMOTE, num_blocks=4, block_size=16, policy=make_policy("lru", 4)
    )
    t = TieredManager(
        CPUOffloadingManager(num_blocks=4, block_size=16), [remote], shared={Medium.REMOTE: store}
    )
    assert t.lookup(keys(1)) == 0
    assert t.has_pending_work
    t.wait_discoveries(0.05)
    assert time.monotonic() - t0 < 5, "a hung store must not hang a bounded wait"
    assert store.finished == 0
    store.release.set()
    d.shutdown()
    t.shutdown()


def test_shutdown_waits_for_the_running_check() -> None:
    store = Gate()
    d = Discovery(store)
    d.ask(keys(1))
    while not store.started:
        time.sleep(0.01)
    threading.Timer(0.1, store.release.set).start()
    d.shutdown()
    assert store.finished == 1
    assert d.in_flight == 0 and d.answers() == []
