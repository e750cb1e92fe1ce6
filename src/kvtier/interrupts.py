"""Stop signals taken only where state is whole: ``critical`` sections.

``kvtier``'s commands turn Ctrl-C and SIGTERM into an exception raised in the main
thread (``kvtier.cli``). Python raises it between any two bytecodes, so it can cut a
hand-over in two: results taken from the worker half and not yet given to the scheduler
half, or jobs taken from the scheduler half and not yet submitted. The scheduler half
then waits for jobs nobody will ever report, and closing the connector (which the
command's ``finally`` does) waited for them for ever.

Code that hands state over runs inside ``critical`` (the connector's engine points and
the reference engine's steps do). A stop signal whose handler calls ``raise_or_defer``
while the main thread is inside a section is raised when the outermost section ends,
with the state whole; outside a section it is raised at once, and so is a second stop
while the first waits (a section that blocks -- a pipe to a stalled child -- can still
be left, by insisting). Sections entered by other threads do not count: the
handler runs in the main thread, and the exception must be raised there. A section
must not block for long (a wait belongs outside it): a stop waits for its end.

Only handlers that call ``raise_or_defer`` are deferred. Python's default ``SIGINT``
handler does not, so ``default_ctrl_c_deferred`` stands in for it while the reference
engine generates (a program or notebook that calls ``LLM.generate`` and is stopped with
Ctrl-C, as a Jupyter user interrupts a cell): the ``KeyboardInterrupt`` comes at a
section's end there too, and a later ``generate`` or ``close`` finds the hand-overs
whole. A handler a program installed itself is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

_MAIN_THREAD = threading.main_thread().ident


class _Critical:
    """The section: re-entrant, counted in the main thread only."""

    __slots__ = ("before_raise", "depth", "pending")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: BaseException | None = None
        self.before_raise: Callable[[], None] | None = None  # the pending stop's

    def __enter__(self) -> None:
        if threading.get_ident() == _MAIN_THREAD:
            self.depth += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if threading.get_ident() != _MAIN_THREAD:
            return
        self.depth -= 1
        if self.depth == 0 and self.pending is not None:
            pending, self.pending = self.pending, None
            before, self.before_raise = self.before_raise, None
            # The stop is raised over an ordinary exception unwinding the section (which
            # becomes its ``__context__``): a caller that caught that exception would
            # never see the stop.
            if exc is None or isinstance(exc, Exception):
                if before is not None:
                    before()
                raise pending


critical = _Critical()
"""``with critical:`` defers stop signals (see the module docstring)."""


def raise_or_defer(exc: BaseException, before_raise: Callable[[], None] | None = None) -> None:
    """From a signal handler (main thread): raise ``exc`` now, or, inside a ``critical``
    section, when the outermost one ends; a second stop while one waits is raised at
    once, inside the section (and the first dropped).

    ``before_raise``: called just before ``exc`` is raised, wherever that is (kvtier's
    command ignores further stop signals then, while its ``finally`` blocks clean up).
    """
    if critical.depth > 0 and critical.pending is None:
        critical.pending, critical.before_raise = exc, before_raise
        return
    critical.pending = critical.before_raise = None
    if before_raise is not None:
        before_raise()
    raise exc


def _deferred_ctrl_c(signum: int, frame: FrameType | None) -> None:
    raise_or_defer(KeyboardInterrupt())


@contextmanager
def default_ctrl_c_deferred() -> Iterator[None]:
    """Inside, in the main thread: if ``SIGINT``'s handler is Python's default, one that
    defers to ``critical`` sections replaces it (and is put back after)."""
    if (
        threading.get_ident() != _MAIN_THREAD
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, _deferred_ctrl_c)
    try:
        yield
    finally:
        with critical:  # a Ctrl-C between the check and the restore waits for both
            if signal.getsignal(signal.SIGINT) is _deferred_ctrl_c:
                signal.signal(signal.SIGINT, signal.default_int_handler)
