"""The thread of a ``RemoteLoop`` over plain sockets: the values of every batch spread,
in submission order, over the loop's non-blocking connections, a window of requests
outstanding on each, and their replies read as the sockets bring them.

Runs in the loop's thread only; imports no torch. One ``Multiplexer`` serves one run
of the thread; if something unforeseen raises, it fails every batch it holds and a
fresh one goes on with the loop's inbox. The bytes of each connection (sending,
reading lines and values) are ``remote_conn.LoopConnection``'s; this module decides
what goes where.
"""

from __future__ import annotations

import collections
import logging
import selectors
import time
from typing import TYPE_CHECKING, Any

from kvtier.errors import TransferError
from kvtier.media.redis_client import readable
from kvtier.media.remote_batches import Batch, BatchResult, Op, Value, report
from kvtier.media.remote_conn import LoopConnection as _Conn
from kvtier.media.remote_values import ReadOutcome, get_window, opened, reject, set_commands
from kvtier.media.resp import BlockValue

if TYPE_CHECKING:
    from kvtier.media.remote_loop import RemoteLoop

logger = logging.getLogger("kvtier.media.remote")

STORE_WINDOW_BYTES = 768 << 10
"""Value bytes of ``SET`` a connection keeps outstanding (at least one value): three
values of 256 KiB, one of 512 KiB or more. A deeper window makes both the client and
the server spend more CPU per GB (the server holds more replies out of its caches),
and stores run slower (``docs/decisions.md``)."""
DELETE_WINDOW = 64
"""``DEL`` requests a connection keeps outstanding (each a few dozen bytes)."""
_GET = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n"
_DEL = b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n"
_LOST = (OSError,)


class Multiplexer:
    """The loop's thread over plain sockets (one instance per thread run)."""

    def __init__(self, loop: RemoteLoop) -> None:
        self.loop = loop
        self.store = loop._store
        self.timeout_s = self.store.options.timeout_s
        self.clock = loop._clock
        px = self.store.options.ttl_s
        self.px = None if px is None else max(1, round(px * 1000))
        self.conns: list[_Conn | None] = [None] * loop._count
        self.queue: collections.deque[Value] = collections.deque()
        self.sel = selectors.DefaultSelector()
        self.sel.register(loop._waker_r, selectors.EVENT_READ, None)

    def run(self) -> bool:
        """Serve until the loop closes (True), or until something unforeseen raises
        (False, every batch it held failed): never a dead thread with jobs waiting."""
        try:
            self._serve()
            return True
        except Exception as e:  # a bug: the batches fail, the thread goes on
            logger.exception("remote %s I/O loop failed; starting it again", self.loop._name)
            self._fail_all(f"remote I/O loop failed: {type(e).__name__}: {e}")
            return False
        finally:
            for held in self.conns:
                if held is not None:
                    held.close()
            self.sel.close()

    def _fail_all(self, why: str) -> None:
        values = list(self.queue)
        self.queue.clear()
        for conn in self.conns:
            if conn is not None:
                values += conn.waiting
                conn.waiting.clear()
        for value in values:
            value.batch.error = value.batch.error or why
            value.batch.refused.clear()
            try:
                self._settle(value, ReadOutcome.MISS)
            except Exception:  # the batch's report itself failed: nothing more to do
                logger.exception("failing a remote batch raised")

    def _serve(self) -> None:
        loop = self.loop
        while True:
            self._admit()
            self._assign()
            busy = [c for c in self.conns if c is not None and c.waiting]
            if self.queue and not busy:
                continue  # a connection was lost while sending: open another
            now = self.clock()
            expired = [c for c in busy if c.deadline <= now]
            for c in expired:
                self._lost(c, TimeoutError(f"no reply in {self.timeout_s} s"))
            if expired:
                continue
            with loop._lock:
                if loop._inbox:
                    continue
                if not busy and loop._closing:
                    return
                loop._sleeping = True
            self._select(min(c.deadline for c in busy) - now if busy else None)

    def _select(self, timeout: float | None) -> None:
        ready = self.sel.select(timeout)
        deadline = self.clock() + self.timeout_s  # an event is progress
        for key, events in ready:
            conn = key.data
            if conn is None:
                self.loop._drain_waker()
                continue
            conn.deadline = deadline
            try:
                if events & selectors.EVENT_WRITE:
                    conn.flush()
                    if not conn.out:
                        self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
                if events & selectors.EVENT_READ:
                    self._read(conn)
            except _LOST as e:
                self._lost(conn, e)
            except Exception as e:  # a bug, or a reply nobody foresaw: never the thread
                logger.exception("remote %s connection failed", self.loop._name)
                self._lost(conn, e)
        with self.loop._lock:
            self.loop._sleeping = False

    # -- batches in and out ----------------------------------------------------------

    def _admit(self) -> None:
        """Move queued batches onto the value queue (if the breaker allows each)."""
        while True:
            batch = self.loop._next(block=False)
            if batch is None:
                return
            batch.started = time.perf_counter()
            batch.outcomes = [ReadOutcome.MISS] * len(batch.keys)
            if not batch.keys:
                self._finish(batch)
                continue
            breaker = self.store.breaker
            if not breaker.allow():
                batch.error = (
                    f"remote store unhealthy after {breaker.failures} failure(s) "
                    f"({breaker.last_error}); next try in {breaker.retry_in():.1f} s"
                )
                batch.left = 0
                self._finish(batch)
                continue
            self.queue.extend(Value(batch, i) for i in range(len(batch.keys)))

    def _finish(self, batch: Batch) -> None:
        load = batch.op is Op.LOAD
        if load:
            hit = ReadOutcome.HIT
            if batch.error is not None:
                batch.outcomes = [o if o is hit else ReadOutcome.MISS for o in batch.outcomes]
            for page, outcome in zip(batch.pages, batch.outcomes, strict=True):
                if outcome is not hit:
                    page[:] = 0
        if batch.refused and batch.error is None:
            batch.error = (
                f"{len(batch.refused)} of {len(batch.keys)} values refused: {batch.refused[0]}"
            )
        if batch.keys and (batch.error is None or batch.refused):
            self.store.breaker.record_success()
        if load and any(o.rejected for o in batch.outcomes):
            self._delete_corrupt(batch)  # reported once they are deleted
        else:
            report(batch)

    def _delete_corrupt(self, batch: Batch) -> None:
        """Queue ``DEL`` of the values ``batch`` found corrupt or undecryptable, and
        report ``batch`` when
        they are answered: requests on the loop's connections like any other (the
        blocking ``delete_many`` this replaced held every batch of the direction for
        up to ``timeout_s``). As before, the values are gone when the batch is reported,
        so a value stored again after that report is never deleted by a late ``DEL``.
        A ``DEL`` that fails is logged (a lost connection is recorded in the breaker, as
        for any request); ``batch`` is reported all the same."""
        corrupt = [i for i, o in enumerate(batch.outcomes) if o.rejected]
        keys = [batch.keys[i] for i in corrupt]

        def deleted(result: BatchResult) -> None:
            if result.error is not None:
                logger.warning(
                    "could not delete %d corrupt remote values: %s", len(keys), result.error
                )
            report(batch)

        names = [batch.names[i] for i in corrupt]
        cleanup = Batch(Op.DELETE, keys, names, [], deleted, left=len(keys))
        cleanup.started = time.perf_counter()
        cleanup.outcomes = [ReadOutcome.MISS] * len(keys)
        self.queue.extend(Value(cleanup, i) for i in range(len(keys)))

    def _settle(self, value: Value, outcome: ReadOutcome | None = None) -> None:
        batch = value.batch
        if outcome is not None:
            batch.outcomes[value.index] = outcome
        batch.left -= 1
        if not batch.left:
            self._finish(batch)

    # -- values onto connections -----------------------------------------------------

    def _assign(self) -> None:
        """Give each connection values up to its window, and send them."""
        queue = self.queue
        while queue and queue[0].batch.error is not None and not queue[0].batch.refused:
            self._settle(queue.popleft())  # its batch failed: never sent
        if not queue:
            return
        for slot in range(len(self.conns)):
            conn = self.conns[slot]
            if conn is not None and not conn.waiting and readable(conn.sock):
                # closed by the server while idle (or out of step): not a failure
                self._lost(conn, ConnectionError("closed while idle"))
                conn = None
            conn = conn or self._open(slot)
            if conn is None:
                return
            was_idle = not conn.waiting
            taken: list[Value] = []
            while queue and len(conn.waiting) < self._window(queue[0]):
                value = queue.popleft()
                batch = value.batch
                if batch.error is not None and not batch.refused:
                    self._settle(value)
                    continue
                conn.waiting.append(value)  # first: held somewhere if ``_commands`` raises
                taken.append(value)
            if taken:
                buffers = self._commands(taken)
                if was_idle:
                    conn.deadline = self.clock() + self.timeout_s
                try:
                    conn.send(buffers)
                except _LOST as e:
                    self._lost(conn, e)
                    continue
                if conn.out:
                    self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            if not queue:
                return

    def _window(self, value: Value) -> int:
        """Requests a connection may have outstanding when ``value`` joins them."""
        op = value.batch.op
        if op is Op.DELETE:
            return DELETE_WINDOW
        nbytes = value.batch.pages[value.index].nbytes
        if op is Op.LOAD:
            return get_window(nbytes)
        return max(1, STORE_WINDOW_BYTES // max(1, nbytes))

    def _commands(self, values: list[Value]) -> list[Any]:
        """The buffers of the values' requests, in order: ``GET`` for a load, ``DEL``
        for a delete; for a run of stores, their ``SET`` formatted together
        (``set_commands``: one buffer per value besides its page)."""
        out: list[Any] = []
        sets: list[tuple[bytes, BlockValue]] = []
        for value in values:
            batch, i = value.batch, value.index
            name = batch.names[i]
            if batch.op is not Op.STORE:
                out += set_commands(sets, self.px)
                sets.clear()
                out.append((_GET if batch.op is Op.LOAD else _DEL) % (len(name), name))
                continue
            sets.append((name, self.store.value(batch.keys[i], batch.pages[i].reshape(-1))))
        return out + set_commands(sets, self.px)

    def _open(self, slot: int) -> _Conn | None:
        """A new connection in ``slot``; on failure every queued value's batch fails."""
        try:
            link, release = self.store.lend_connection()
        except TransferError as e:
            queue, self.queue = self.queue, collections.deque()
            for value in queue:
                value.batch.error = value.batch.error or str(e)
                value.batch.refused.clear()
                self._settle(value)
            return None
        conn = _Conn(link, self.timeout_s, release)
        self.conns[slot] = conn
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)
        return conn

    def _lost(self, conn: _Conn, error: BaseException) -> None:
        """Drop a connection; its values (and their batches) fail."""
        self.sel.unregister(conn.sock)
        self.conns[self.conns.index(conn)] = None
        conn.close()
        if not conn.waiting:
            return  # an idle connection the server closed: not a failure of the store
        why = f"{type(error).__name__}: {error}"  # redis-py's repr drops the message
        self.store.breaker.record_failure(why)
        why = f"remote store failed: {why}"
        while conn.waiting:
            value = conn.waiting.popleft()
            value.batch.error = value.batch.error or why
            value.batch.refused.clear()
            self._settle(value, ReadOutcome.MISS)

    # -- replies ---------------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        """Read every reply the socket holds now, settling values as they end."""
        conn.drained = False
        waiting = conn.waiting
        if not waiting:  # the server closed an idle connection (or sent what nobody asked)
            raise ConnectionError("an idle connection became readable")
        while waiting:
            value = waiting[0]
            if conn.rest:
                if not conn.fill():
                    return
                assert value.header is not None and value.crlf is not None
                assert value.stored is not None
                if value.crlf != b"\r\n":
                    raise ConnectionError("a bulk reply not ended by CRLF")
                batch, i = value.batch, value.index
                outcome = opened(
                    self.store.codec, batch.keys[i], value.header, value.stored, batch.pages[i]
                )
                value.stored = None
                waiting.popleft()
                self._settle(value, outcome)
                continue
            if conn.skip:
                if not conn.discard():
                    return
                waiting.popleft()
                self._settle(value, value.outcome)
                continue
            line = conn.line()
            if line is None:
                return
            if value.batch.op is Op.LOAD:
                self._got(conn, value, line)
            elif value.batch.op is Op.STORE:
                self._stored(waiting, value, line)
            else:
                self._deleted(waiting, value, line)

    # A reply that is not the command's is raised while its value still waits on the
    # connection, so that losing the connection fails it with the others (popped
    # first, it would never be reported, nor its batch).

    def _stored(self, waiting: collections.deque[Value], value: Value, line: bytes) -> None:
        if line != b"+OK" and not line.startswith(b"-"):
            raise ConnectionError(f"unexpected reply to SET: {line[:40]!r}")
        waiting.popleft()
        # refused (OOM, ...): the batch fails, the store is fine -- unless a connection
        # of the batch was lost
        if line.startswith(b"-") and value.batch.error is None:
            value.batch.refused.append(line[1:].decode(errors="replace"))
        self._settle(value)

    def _deleted(self, waiting: collections.deque[Value], value: Value, line: bytes) -> None:
        if not line.startswith((b":", b"-")):  # ``:n`` removed (0 if evicted meanwhile)
            raise ConnectionError(f"unexpected reply to DEL: {line[:40]!r}")
        waiting.popleft()
        # refused: the batch fails (logged), the store is fine
        if line.startswith(b"-") and value.batch.error is None:
            value.batch.refused.append(line[1:].decode(errors="replace"))
        self._settle(value)

    def _got(self, conn: _Conn, value: Value, line: bytes) -> None:
        batch, i = value.batch, value.index
        key, page = batch.keys[i], batch.pages[i]
        codec = self.store.codec
        expected = codec.header_size(len(key)) + page.nbytes
        if line in (b"$-1", b"_"):  # nil in RESP2, null in RESP3
            conn.waiting.popleft()
            self._settle(value, ReadOutcome.MISS)
        elif line.startswith(b"-"):  # an error reply: a foreign value (WRONGTYPE, ...)
            conn.waiting.popleft()
            self._settle(value, reject(key, page, line.decode(errors="replace")))
        elif line.startswith((b"$", b"!")):
            try:
                length = int(line[1:])
            except ValueError:
                raise ConnectionError(f"unexpected reply to GET: {line[:40]!r}") from None
            # a value of the other format is read whole too: its header says why it
            # does not open here
            if line.startswith(b"$") and length - page.nbytes in codec.header_sizes(len(key)):
                value.header, value.crlf = bytearray(length - page.nbytes), bytearray(2)
                value.stored = codec.landing(page.reshape(-1))
                payload = value.stored[: page.nbytes].data.cast("B")
                conn.rest = [memoryview(value.header), payload, memoryview(value.crlf)]
            elif line.startswith(b"$") and length < 0:
                raise ConnectionError(f"unexpected reply to GET: {line[:40]!r}")
            else:
                why = "error reply" if line.startswith(b"!") else f"value of {length} bytes"
                value.outcome = reject(key, page, f"{why}, expected {expected}")
                conn.skip = length + 2
        else:
            raise ConnectionError(f"unexpected reply to GET: {line[:40]!r}")
