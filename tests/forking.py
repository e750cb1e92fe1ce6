"""Forked children for tests of what survives ``os.fork`` (``kvtier.media.forks``)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def run_in_forked_child(body: Callable[[], bool], in_parent: Callable[[], None]) -> None:
    """Fork: the child runs ``body`` and exits 0 if it returns True (1 if not, or if it
    raises); the parent runs ``in_parent``, then waits for the child. Fails if the
    child failed, or hung (still running after a generous 60 s)."""
    pid = os.fork()
    if pid == 0:  # the child: only this thread; the parent's other threads are gone
        code = 1
        try:
            code = 0 if body() else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    in_parent()
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the forked child failed"


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[threading.Event]:
    """``lock`` held by another thread until the event yielded is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        yield release
    finally:
        release.set()
        holder.join()
