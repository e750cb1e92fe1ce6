"""``kvtier.interrupts``: a stop signal raised only where state is whole.

Through kvtier's own handler (``kvtier.cli._on_signal``) and real signals sent to this
process, and through ``raise_or_defer`` directly for the cases a signal cannot stage.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from kvtier.cli import STOP_SIGNALS, Terminated, _on_signal
from kvtier.interrupts import critical, default_ctrl_c_deferred, raise_or_defer


@pytest.fixture
def handlers() -> Iterator[None]:
    previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert critical.depth == 0 and critical.pending is None


def test_outside_a_section_the_signal_raises_at_once(handlers: None) -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        steps.append("after")
    assert steps == []


@pytest.mark.parametrize(
    ("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)]
)
def test_inside_nested_sections_it_waits_for_the_outermost_end(
    handlers: None, signum: int, raised: type[BaseException]
) -> None:
    steps = []
    with pytest.raises(raised):
        with critical:
            with critical:
                signal.raise_signal(signum)
                steps.append("inner rest")
            steps.append("outer rest")
        steps.append("after")
    assert steps == ["inner rest", "outer rest"]


def test_a_section_of_another_thread_defers_nothing(handlers: None) -> None:
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with critical:
            entered.set()
            leave.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    entered.wait(10)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        leave.set()
        other.join()


def test_the_stop_wins_over_an_exception_unwinding_the_section() -> None:
    # the handler ignores further stop signals: dropped here, a caller catching the
    # ValueError could never be stopped again
    with pytest.raises(KeyboardInterrupt) as stopped, critical:
        raise_or_defer(KeyboardInterrupt())
        raise ValueError("the section's own failure")
    assert isinstance(stopped.value.__context__, ValueError)
    with critical:  # raised once: it does not come back at a later section's end
        pass


def test_an_exit_unwinding_the_section_is_not_replaced() -> None:
    with pytest.raises(SystemExit), critical:
        raise_or_defer(KeyboardInterrupt())
        raise SystemExit(3)


def test_a_second_stop_while_one_waits_is_raised_at_once_inside_the_section(
    handlers: None,
) -> None:
    # a section that blocks (a pipe to a stalled child) can still be left by insisting
    steps = []
    with pytest.raises(Terminated), critical:
        signal.raise_signal(signal.SIGINT)
        steps.append("after the first")
        assert signal.getsignal(signal.SIGINT) is _on_signal  # not ignored yet
        signal.raise_signal(signal.SIGTERM)
        steps.append("after the second")
    assert steps == ["after the first"]
    assert critical.pending is None  # the first is dropped, not raised later
    with critical:
        pass


def test_kvtiers_handler_ignores_further_stops_once_one_is_raised(handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt), critical:
        signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is _on_signal
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    signal.raise_signal(signal.SIGTERM)  # ignored: the finally blocks run in peace


def test_pythons_own_ctrl_c_handler_is_stood_in_for_and_put_back() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        steps = []
        with pytest.raises(KeyboardInterrupt), default_ctrl_c_deferred(), critical:
            signal.raise_signal(signal.SIGINT)
            steps.append("rest of the section")
        assert steps == ["rest of the section"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_programs_own_ctrl_c_handler_is_left_alone() -> None:
    seen: list[int] = []

    def own(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, own)
    try:
        with default_ctrl_c_deferred():
            assert signal.getsignal(signal.SIGINT) is own
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
