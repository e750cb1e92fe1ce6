"""``RemoteLoop``: one I/O thread that moves batches of block values over several
non-blocking connections to one Redis.

Runs on the worker side; imports no torch. ``submit`` hands a batch (the values of one
job: store or load) to the loop's thread and returns at once; the thread spreads the
values of every batch, in submission order, over ``connections`` non-blocking
sockets, a window of requests outstanding on each (``remote_values.get_window`` for
loads, ``remote_mux.STORE_WINDOW_BYTES`` for stores), and calls the batch's
``on_done`` with a ``BatchResult`` once each of its values is answered or lost. One
thread and a ``selectors`` loop (``remote_mux.Multiplexer``) rather than a thread per
connection: no GIL handovers or futex wake-ups between I/O threads.

Each value keeps every check of the blocking path (``remote_values``): a load reads
its reply straight into the caller's page and verifies it there (header, format
version, XXH3-64); a value that is not a verified block of its key (wrong length,
checksum, header, a foreign type) is zeroed and ``CORRUPT``, and is deleted by a
``DEL`` the loop sends on its connections like any request (never a blocking call on
its thread) before its batch is reported; a miss is zeroed. A batch whose
connection failed (an error, the server closing it, or no progress for
``timeout_s``) fails as a whole and records the failure in the store's
``CircuitBreaker``; the values of the batch still in flight on other
connections are first read to the end (the loop never writes into a page after its
batch was reported), and every page of a failed load that is not a verified hit is
zeroed. A batch is started only if the breaker allows it (else it fails at once,
"unhealthy"), and a batch that succeeded records a success.

A cluster or TLS store (whose sockets are not plain) is served by the same thread
through the store's blocking calls (``write_many`` / ``read_many_into``), one batch at
a time.

In a forked child the loop starts afresh (``_after_fork``): no thread (started again
on the next ``submit``), no connections (their sockets are the parent's), no batches
(their owners fail them; see ``CpuRemoteHandler``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from kvtier.errors import TransferError
from kvtier.media.forks import renew_after_fork
from kvtier.media.remote import RemoteStore
from kvtier.media.remote_batches import Batch, BatchResult, Op
from kvtier.media.remote_mux import Multiplexer
from kvtier.media.remote_values import ReadOutcome

__all__ = ["BatchResult", "Op", "RemoteLoop"]

logger = logging.getLogger("kvtier.media.remote")


class RemoteLoop:
    """The I/O thread of one direction over a ``RemoteStore``. See the module docstring.

    Args:
        store: the store (its owner closes it; the loop borrows ``connections`` of
            its connections for as long as it runs).
        connections: sockets the loop multiplexes.
        name: the thread's name.
        clock: monotonic seconds, for the per-connection timeout (tests move one by
            hand; ``select`` still waits in real seconds).
    """

    def __init__(
        self,
        store: RemoteStore,
        *,
        connections: int,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if connections < 1:
            raise ValueError(f"connections must be >= 1, got {connections}")
        self._store = store
        self._count = connections
        self._name = name
        self._clock = clock
        self._start_fresh()
        renew_after_fork(self)

    def _start_fresh(self) -> None:
        self._lock = threading.Lock()
        self._inbox: collections.deque[Batch] = collections.deque()
        self._closing = False
        self._sleeping = False
        self._thread: threading.Thread | None = None
        self._waker_r, self._waker_w = socket.socketpair()
        self._waker_r.setblocking(False)
        self._waker_w.setblocking(False)

    def _after_fork(self) -> None:
        """In a forked child: nothing of the parent's loop (thread, sockets, batches)."""
        self._start_fresh()

    def submit(
        self,
        op: Op,
        keys: Sequence[bytes],
        pages: Sequence[np.ndarray],
        on_done: Callable[[BatchResult], None],
        names: list[bytes] | None = None,
    ) -> None:
        """Queue a batch; ``on_done`` is called once, from the loop's thread.
        ``names``: the keys' ``store.redis_key``s, when the caller made them already.

        Raises:
            RuntimeError: the loop is closed.
        """
        if names is None:
            names = [self._store.redis_key(k) for k in keys]
        batch = Batch(op, list(keys), names, list(pages), on_done, left=len(keys))
        with self._lock:
            if self._closing:
                raise RuntimeError("the remote loop is closed")
            self._inbox.append(batch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._sleeping:
                self._sleeping = False
                self._wake()

    def close(self) -> None:
        """Finish every queued batch, then end the thread and close its sockets."""
        with self._lock:
            self._closing = True
            thread = self._thread
            self._wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._waker_r.close()
        self._waker_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (it wakes anyway) or closed
            self._waker_w.send(b"\0")

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        if self._store.multiplexable:
            while not Multiplexer(self).run():
                pass  # it failed what it held: a fresh one goes on with the inbox
            return
        while True:
            batch = self._next(block=True)
            if batch is None:
                return
            _run_blocking(self._store, batch)

    def _next(self, block: bool) -> Batch | None:
        """The next queued batch; None when there is none (and, if ``block``, the loop
        is closing)."""
        while True:
            with self._lock:
                if self._inbox:
                    return self._inbox.popleft()
                if not block or self._closing:
                    return None
                self._sleeping = True
            self._sleep(None)

    def _sleep(self, timeout: float | None) -> None:
        sel = selectors.DefaultSelector()
        with sel:
            sel.register(self._waker_r, selectors.EVENT_READ)
            sel.select(timeout)
        self._drain_waker()

    def _drain_waker(self) -> None:
        with contextlib.suppress(OSError):
            while self._waker_r.recv(4096):
                pass


def _run_blocking(store: RemoteStore, batch: Batch) -> None:
    """A batch through the store's blocking calls (cluster, TLS)."""
    start = time.perf_counter()
    error: str | None = None
    outcomes: tuple[ReadOutcome, ...] = ()
    try:
        if batch.op is Op.STORE:
            store.write_many(batch.keys, batch.pages)
        elif batch.op is Op.DELETE:
            store.delete_many(batch.keys)
        else:
            outcomes = tuple(store.read_many_into(batch.keys, batch.pages))
    except TransferError as e:
        error = str(e)
    except Exception as e:  # a bug: reported, never raised into the loop
        logger.exception("remote %s raised", batch.op.value)
        error = f"unexpected {e!r}"
    if error is not None and batch.op is Op.LOAD:
        for page in batch.pages:
            page[:] = 0
        outcomes = (ReadOutcome.MISS,) * len(batch.keys)
    try:
        batch.on_done(BatchResult(error, outcomes, time.perf_counter() - start))
    except Exception:
        logger.exception("a remote batch's on_done raised")
