"""Doorbells: where a ``ThreadLane``'s worker thread sleeps until there is a job for it.

Runs in the worker process: ``ring`` and ``claim`` in whichever thread queues or takes
a job (under the lane's lock), ``sleep`` in the lane's worker thread. A doorbell
counts the jobs queued that no runner has taken yet (*unclaimed*; the lane keeps it
equal to its queue's length: ``ring`` with each append, ``claim`` with each pop).
``sleep`` returns ``True`` when a job is unclaimed and ``False`` once the bell is
closed with none unclaimed; a wake-up with nothing unclaimed sleeps again inside it.

Why it matters (issue #15, ``docs/worker.md``): a caller blocked in ``wait`` runs the
queued job itself, claiming it a few microseconds after the submit that rang. With a
Python condition the worker thread, woken by that ring, came back into Python to
find the queue empty, taking the GIL from the caller in the middle of the job (a
16 KiB x 16 store cost ~40 us more than its copy). ``NativeDoorbell`` sleeps in C with
the GIL released and rechecks the count there: a worker whose job was claimed
first goes back to sleep without touching the GIL. A job nobody waits for is still
started by the worker once it wakes (one futex wake, as before); the grace below
is given only while the lane's last job was claimed by a waiting caller, so a lane
whose jobs nobody waits for starts each at once (under CPU load one ``sched_yield``
of the grace can last a scheduler slice: milliseconds, measured in review).

* ``NativeDoorbell``: ``rowcopy.c``'s ``kvtier_bell_*`` (a pthread mutex and
  condition), from the library the row copier builds. A worker woken by a ring
  leaves the job ``GRACE_NS`` (yielding its CPU) to be claimed before it returns,
  when the last job was claimed by a waiting caller;
  ``ring`` and ``claim`` are called holding the GIL (``ctypes.PyDLL``: no GIL
  hand-off in the middle of the lane's bookkeeping), ``sleep`` releasing it
  (``ctypes.CDLL``).
* ``PyDoorbell``: the pure-Python fallback (a ``threading.Condition``), used where
  the library is not built (no compiler, ``KVTIER_NATIVE_COPY=0``): correct, and as
  slow as before for waited-on small jobs.

One thread sleeps on a doorbell at a time (the lane's worker).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Protocol

from kvtier.worker.rowcopy import NativeRowCopier, native_row_copier

GRACE_NS = 5_000
"""Nanoseconds a worker woken by a ring waits (in C, yielding the CPU) for a caller
to claim the job before it comes back into Python to run it: the caller's few
microseconds of Python between its submit and its ``wait``. Without it the woken
worker usually checked first (the ring's futex wake takes ~10 us on the development
VM, and the woken thread often runs on the caller's CPU before the caller resumes)
and came back into Python anyway. Given only while the lane's last job was claimed by a
waiting caller (``claim(by_waiter=True)``): a job nobody waits for, after jobs nobody
waited for, starts at once. Measured in ``docs/worker.md``."""


class Doorbell(Protocol):
    """What a lane needs from a doorbell (see the module docstring)."""

    def ring(self) -> None:
        """One more job queued: wake the sleeper, if any."""

    def claim(self, by_waiter: bool) -> None:
        """A runner took one job off the queue (``by_waiter``: a caller blocked in
        ``wait``, not the sleeper)."""

    def sleep(self) -> bool:
        """Block until a job is unclaimed (True) or the bell is closed with none (False)."""

    def close(self) -> None:
        """No more rings; the sleeper returns False once nothing is unclaimed. Idempotent."""

    def unclaimed(self) -> int:
        """Jobs rung and not claimed (for tests and invariants)."""

    def renewed(self) -> Doorbell:
        """A fresh bell of the same kind, for a forked child (``ThreadLane._after_fork``).
        This one is never used again, nor its state freed (a lock or a C mutex a parent's
        thread held at the fork stays held in the child)."""


class PyDoorbell:
    """The pure-Python doorbell: a condition of its own (never the lane's lock)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._unclaimed = 0
        self._closed = False

    def ring(self) -> None:
        with self._cond:
            self._unclaimed += 1
            self._cond.notify()

    def claim(self, by_waiter: bool) -> None:
        with self._cond:
            self._unclaimed -= 1

    def sleep(self) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._unclaimed > 0 or self._closed)
            return self._unclaimed > 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def unclaimed(self) -> int:
        with self._cond:
            return self._unclaimed

    def renewed(self) -> Doorbell:
        return PyDoorbell()


class _BellLib:
    """The ``kvtier_bell_*`` functions of one loaded library, typed once."""

    def __init__(self, path: str) -> None:
        held, released = ctypes.PyDLL(path), ctypes.CDLL(path)
        self.new = held.kvtier_bell_new
        self.new.restype, self.new.argtypes = ctypes.c_void_p, [ctypes.c_int64]
        self.free = held.kvtier_bell_free
        self.ring = held.kvtier_bell_ring
        self.claim = held.kvtier_bell_claim
        self.close = held.kvtier_bell_close
        self.unclaimed = held.kvtier_bell_unclaimed
        self.graced = held.kvtier_bell_graced
        self.sleep = released.kvtier_bell_sleep  # the one call that blocks: GIL released
        for fn in (self.free, self.ring, self.close, self.unclaimed, self.graced, self.sleep):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = None
        self.claim.argtypes, self.claim.restype = [ctypes.c_void_p, ctypes.c_int32], None
        self.unclaimed.restype = ctypes.c_int64
        self.graced.restype = ctypes.c_int32
        self.sleep.restype = ctypes.c_int32


class NativeDoorbell:
    """The compiled doorbell: the worker sleeps and rechecks in C, GIL released.

    The C state is freed when this object is collected (after its lane's thread has
    ended: that thread holds the lane, which holds the bell), never once the bell is
    ``renewed`` in a forked child.
    """

    def __init__(self, native: NativeRowCopier, grace_ns: int = GRACE_NS) -> None:
        """``grace_ns``: how long a sleeper woken by a ring leaves the job to a caller
        about to claim it (``GRACE_NS``; 0: none)."""
        lib = _bell_lib(str(native.path))
        handle = lib.new(grace_ns)
        if not handle:
            raise MemoryError("kvtier_bell_new returned NULL")
        self._handle = ctypes.c_void_p(handle)
        self._lib = lib
        self._native, self._grace_ns = native, grace_ns
        # not at exit: a daemon lane thread may still sleep on it then (freeing a
        # condition with a waiter blocks)
        self._free = weakref.finalize(self, lib.free, self._handle)
        self._free.atexit = False

    def ring(self) -> None:
        self._lib.ring(self._handle)

    def claim(self, by_waiter: bool) -> None:
        self._lib.claim(self._handle, by_waiter)

    def sleep(self) -> bool:
        return bool(self._lib.sleep(self._handle))

    def close(self) -> None:
        self._lib.close(self._handle)

    def unclaimed(self) -> int:
        return int(self._lib.unclaimed(self._handle))

    def renewed(self) -> Doorbell:
        # the C state is left as it is, never freed: in a child forked while the
        # parent's worker slept on it, ``pthread_cond_destroy`` would wait for that
        # sleeper forever (a few dozen bytes per fork)
        self._free.detach()
        return NativeDoorbell(self._native, self._grace_ns)

    def graced(self) -> bool:
        """Whether a sleeper woken now would give the grace: only while the last job
        was claimed by a waiting caller (for tests)."""
        return bool(self._lib.graced(self._handle))


_LIBS: dict[str, _BellLib] = {}
_LIBS_LOCK = threading.Lock()


def _bell_lib(path: str) -> _BellLib:
    lib = _LIBS.get(path)  # loaded once, then no lock: none is taken in a forked child
    if lib is not None:  # (``renewed``), where another thread may have held it
        return lib
    with _LIBS_LOCK:
        lib = _LIBS.get(path)
        if lib is None:
            lib = _LIBS[path] = _BellLib(path)
        return lib


def new_doorbell() -> Doorbell:
    """A ``NativeDoorbell`` where the compiled library is available, else a ``PyDoorbell``."""
    native = native_row_copier()
    return PyDoorbell() if native is None else NativeDoorbell(native)
