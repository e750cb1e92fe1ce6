"""``RemoteLoop``: one I/O thread over several non-blocking connections.

Against a real redis-server: values round trip whatever the reads' splits (every read
cut to ``step`` bytes by ``Trickle``, so a split falls in every line, header, payload
and CRLF) and however a batch's values spread over connections; a wrong-length,
wrong-checksum, foreign or other-key value in the middle of a batch is a deleted
``CORRUPT`` whose neighbours on the same connection still load; a hung server times
out. Against a scripted server: a connection closed in the middle of a reply fails
its batch (pages zeroed, the breaker told) and the next batch reconnects. ``close``
ends the thread and closes its sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.media import block_format, redis_client, remote_batches, remote_mux, remote_values
from kvtier.media.circuit_breaker import Backoff, CircuitBreaker
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore
from kvtier.media.remote_loop import BatchResult, Op, RemoteLoop

from ..fake_clock import Clock
from ..redis_server import RedisServer

FP = b"\x5a" * 32
BLOCK = 3000


def key(i: int) -> bytes:
    return bytes([i]) * 32


def payload(i: int, n: int = BLOCK) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


class Trickle:
    """A non-blocking socket whose every read returns at most ``step`` bytes."""

    def __init__(self, sock: socket.socket, step: int) -> None:
        self._sock, self.step = sock, step

    def fileno(self) -> int:
        return self._sock.fileno()

    def sendmsg(self, buffers: Sequence[Any]) -> int:
        return self._sock.sendmsg(buffers)

    def recv_into(self, buf: memoryview, nbytes: int = 0) -> int:
        return self._sock.recv_into(buf, min(nbytes or len(buf), self.step))

    def recvmsg_into(self, buffers: Sequence[memoryview]) -> tuple[int, Any, int, Any]:
        left, cut = self.step, []
        for b in buffers:
            if left <= 0:
                break
            cut.append(memoryview(b)[:left])
            left -= len(cut[-1])
        return self._sock.recvmsg_into(cut)


@pytest.fixture
def conns(monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], list[Any]]:
    """Make the loop's connections read through ``Trickle`` (``None``: as they are);
    returns the list of connections made."""

    def use(step: int | None) -> list[Any]:
        made: list[Any] = []

        class Recorded(remote_mux._Conn):
            def __init__(self, *args: Any) -> None:
                super().__init__(*args)
                self.raw, self.sends = self.sock, 0
                if step is not None:
                    self.sock = Trickle(self.sock, step)  # type: ignore[assignment]
                made.append(self)

            def send(self, buffers: list[Any]) -> None:
                self.sends += 1
                super().send(buffers)

        monkeypatch.setattr(remote_mux, "_Conn", Recorded)
        return made

    return use


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_store(url: str, clock: Clock, timeout_s: float = 5.0) -> RemoteStore:
    breaker = CircuitBreaker(Backoff(base_s=1.0, max_s=1.0, jitter=0.0), clock=clock)
    options = RemoteOptions(url=url, timeout_s=timeout_s, max_connections=8)
    return RemoteStore.open(FP, options, breaker=breaker, environ={})


def run(loop: RemoteLoop, batches: list[tuple[Op, list[bytes], list[np.ndarray]]]) -> list[Any]:
    """Submit every batch at once; their results, in submission order."""
    results: list[BatchResult | None] = [None] * len(batches)
    done = threading.Semaphore(0)

    def report(i: int, r: BatchResult) -> None:
        results[i] = r
        done.release()

    for i, (op, keys, pages) in enumerate(batches):
        loop.submit(op, keys, pages, lambda r, i=i: report(i, r))
    for _ in batches:
        assert done.acquire(timeout=60), "a batch never finished"
    return results


def small_windows(monkeypatch: pytest.MonkeyPatch, values: int) -> None:
    """Windows of ``values`` values per connection, so a batch spreads over them."""
    monkeypatch.setattr(remote_values, "WINDOW_BYTES", values * BLOCK)
    monkeypatch.setattr(remote_mux, "STORE_WINDOW_BYTES", values * BLOCK)


@pytest.mark.parametrize("connections", [1, 3])
@pytest.mark.parametrize("step", [1, 7, 1000, None])
def test_values_round_trip_across_any_split_and_any_connection(
    server: RedisServer,
    clock: Clock,
    conns: Callable[[int | None], list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    step: int | None,
    connections: int,
) -> None:
    made = conns(step)
    small_windows(monkeypatch, 2)
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=connections, name="test-loop")
    sizes = [5, 8, 3, 8]
    starts = np.cumsum([0, *sizes])
    keys = [key(i) for i in range(sum(sizes))]
    data = [payload(i) for i in range(len(keys))]
    parts = [range(int(a), int(b)) for a, b in itertools.pairwise(starts)]
    try:
        stored = run(loop, [(Op.STORE, [keys[i] for i in p], [data[i] for i in p]) for p in parts])
        assert [r.error for r in stored] == [None] * 4
        outs = np.full((len(keys), BLOCK), 0xAB, np.uint8)
        loaded = run(loop, [(Op.LOAD, [keys[i] for i in p], [outs[i] for i in p]) for p in parts])
        assert [r.error for r in loaded] == [None] * 4
        assert [o for r in loaded for o in r.outcomes] == [ReadOutcome.HIT] * len(keys)
        for i in range(len(keys)):
            assert np.array_equal(outs[i], data[i]), i
        assert len(made) == connections and all(c.sends for c in made)
        assert store.healthy
    finally:
        loop.close()
        store.close()


@pytest.mark.parametrize("step", [1, 5, None])
def test_bad_values_mid_batch_are_deleted_misses_and_their_neighbours_load(
    server: RedisServer, clock: Clock, conns: Callable[[int | None], list[Any]], step: int | None
) -> None:
    conns(step)
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=1, name="test-loop")
    keys = [key(i) for i in range(8)]
    data = [payload(i) for i in range(8)]
    name = store.redis_key
    try:
        run(loop, [(Op.STORE, keys, data)])
        with server.client() as c:
            c.set(name(keys[1]), b"short")  # wrong length
            c.setrange(name(keys[2]), 500, b"flipped")  # wrong checksum
            c.delete(name(keys[3]))
            c.lpush(name(keys[3]), b"x")  # another type: an error reply
            c.delete(name(keys[4]))  # a miss
            c.copy(name(keys[0]), name(keys[5]), replace=True)  # another key's block
            wrong = b"x" * (store.header_size(32) + BLOCK)  # the right length, no header
            c.set(name(keys[6]), wrong)
        outs = np.full((8, BLOCK), 0xAB, np.uint8)
        (result,) = run(loop, [(Op.LOAD, keys, list(outs))])
        hit, bad, miss = ReadOutcome.HIT, ReadOutcome.CORRUPT, ReadOutcome.MISS
        assert result.error is None
        assert list(result.outcomes) == [hit, bad, bad, bad, miss, bad, bad, hit]
        for i in (0, 7):
            assert np.array_equal(outs[i], data[i])
        assert not outs[1:7].any()
        assert store.exists_many(keys) == [True] + [False] * 6 + [True]
        assert store.healthy
    finally:
        loop.close()
        store.close()


def test_a_hung_server_times_out_fails_the_batch_and_the_next_one_reconnects(
    server: RedisServer, clock: Clock
) -> None:
    store = open_store(server.url, clock, timeout_s=0.5)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(4)], [payload(i) for i in range(4)]
    try:
        run(loop, [(Op.STORE, keys, data)])
        server.pause()
        outs = np.full((4, BLOCK), 0xAB, np.uint8)
        (result,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert "no reply in 0.5 s" in (result.error or "")
        assert list(result.outcomes) == [ReadOutcome.MISS] * 4 and not outs.any()
        assert not store.healthy
        (fast,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert "unhealthy" in (fast.error or "")
        server.resume()
        clock.now += 5.0
        (again,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert again.error is None and list(again.outcomes) == [ReadOutcome.HIT] * 4
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        assert store.healthy
    finally:
        loop.close()
        store.close()


def test_a_refused_store_fails_its_batch_but_not_the_store(tmp_path: Path, clock: Clock) -> None:
    server = RedisServer(tmp_path, ["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"])
    server.start()
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    try:
        big = [payload(i, 200_000) for i in range(12)]
        (result,) = run(loop, [(Op.STORE, [key(i) for i in range(12)], big)])
        assert "values refused" in (result.error or "") and "OOM" in (result.error or "")
        assert store.healthy
    finally:
        loop.close()
        store.close()
        server.stop()


def test_close_ends_the_thread_and_closes_its_sockets(
    server: RedisServer, clock: Clock, conns: Callable[[int | None], list[Any]]
) -> None:
    made = conns(None)
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=3, name="test-loop-close")
    try:
        run(loop, [(Op.STORE, [key(i)], [payload(i)]) for i in range(6)])
        thread = loop._thread
        assert thread is not None and thread.is_alive() and made
        loop.close()
        assert not thread.is_alive()
        assert all(c.raw.fileno() == -1 for c in made)
        assert [t for t in threading.enumerate() if t.name == "test-loop-close"] == []
        with pytest.raises(RuntimeError, match="closed"):
            loop.submit(Op.STORE, [key(0)], [payload(0)], lambda r: None)
    finally:
        loop.close()
        store.close()


def test_connections_the_server_closed_while_idle_are_replaced_without_a_failure(
    server: RedisServer,
    clock: Clock,
    conns: Callable[[int | None], list[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server drops idle clients (its ``timeout``, a restart of a proxy, ``CLIENT
    KILL``): the next batch goes out on new connections, and nothing counts as an
    outage. Whether the loop saw the close before the batch came (its ``select``) or
    only when it hands the batch out (an idle connection must not be readable), the
    batch succeeds."""
    made = conns(None)
    small_windows(monkeypatch, 1)
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(6)], [payload(i) for i in range(6)]
    try:
        assert run(loop, [(Op.STORE, keys, data)])[0].error is None
        with server.client() as c:
            me = c.client_id()
            theirs = [int(x["id"]) for x in c.client_list() if int(x["id"]) != me]
            assert len(theirs) == len(made) == 2
            for i in theirs:
                c.client_kill_filter(_id=i)
            while any(int(x["id"]) != me for x in c.client_list()):
                pass  # until the server has closed them
        outs = np.full((6, BLOCK), 0xAB, np.uint8)
        (result,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert result.error is None and list(result.outcomes) == [ReadOutcome.HIT] * 6
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        assert store.outages == 0 and store.healthy and len(made) == 4
    finally:
        loop.close()
        store.close()


# -- a scripted server: replies cut short -----------------------------------------------


class ScriptedRedis:
    """Serves ``SET``/``GET`` from a dict, one thread per connection; ``cut`` says
    which ``GET`` (counted from 0 over all connections) gets half its reply, then
    the connection closed, ``garble`` which gets a reply line that is no RESP;
    ``hold`` names keys whose ``GET`` waits for ``release``, ``hold_deletes`` keys
    whose ``DEL`` does (``deleting`` once one came); ``deleted`` lists the keys of
    every ``DEL`` answered. ``trickle`` maps keys to the bytes per piece of their
    ``GET`` reply, each piece sent once ``piece`` is released (``piece_sent`` then);
    ``odd`` maps ``SET`` or ``DEL`` to a reply line that is not that command's;
    ``socks`` are the server's ends of the connections."""

    def __init__(
        self, cut: int | None = None, hold: Sequence[bytes] = (), garble: int | None = None
    ) -> None:
        self.values: dict[bytes, bytes] = {}
        self.cut, self.hold, self.garble = cut, set(hold), garble
        self.hold_deletes: set[bytes] = set()
        self.deleting = False  # a held DEL came in
        self.deleted: list[bytes] = []
        self.trickle: dict[bytes, int] = {}
        self.odd: dict[bytes, bytes] = {}
        self.piece, self.piece_sent = threading.Semaphore(0), threading.Semaphore(0)
        self.socks: list[socket.socket] = []
        self.release = threading.Event()
        self.gets = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self.socks.append(conn)
        # a client drops a connection it found out of step, its replies unread: the
        # reset that makes is the end of that connection, nothing more
        with conn, contextlib.suppress(ConnectionResetError):
            stream = conn.makefile("rb")
            while (args := _read_command(stream)) is not None:
                verb = args[0].upper()
                if verb in self.odd:
                    conn.sendall(self.odd[verb])
                elif verb == b"SET":
                    self.values[args[1]] = args[2]
                    conn.sendall(b"+OK\r\n")
                elif verb == b"GET":
                    with self._lock:
                        n, self.gets = self.gets, self.gets + 1
                    if args[1] in self.hold:
                        self.release.wait(30)
                    value = self.values.get(args[1])
                    reply = b"_\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value)
                    if n == self.garble:
                        reply = b"$12x\r\n"
                    if n == self.cut:
                        conn.sendall(reply[: len(reply) // 2])
                        return
                    step = self.trickle.get(args[1])
                    for start in range(0, len(reply), step or len(reply)):
                        if step is not None and not self.piece.acquire(timeout=60):
                            return
                        try:
                            conn.sendall(reply[start : start + (step or len(reply))])
                        except OSError:  # the client gave up on the reply
                            return
                        finally:
                            self.piece_sent.release()
                elif verb == b"DEL":
                    if args[1] in self.hold_deletes:
                        self.deleting = True
                        self.release.wait(30)
                    self.deleted.append(args[1])
                    conn.sendall(b":%d\r\n" % (self.values.pop(args[1], None) is not None))
                elif verb == b"EXISTS":
                    conn.sendall(b":0\r\n")
                elif verb == b"PING":
                    conn.sendall(b"+PONG\r\n")
                else:
                    conn.sendall(b"+OK\r\n")

    def close(self) -> None:
        self.release.set()
        self._listener.close()


def _read_command(stream: Any) -> list[bytes] | None:
    line = stream.readline()
    if not line:
        return None
    args = []
    for _ in range(int(line[1:])):
        size = int(stream.readline()[1:])
        args.append(stream.read(size + 2)[:-2])
    return args


@pytest.mark.parametrize(
    ("fault", "why"), [({"cut": 2}, "closed"), ({"garble": 1}, "unexpected reply to GET")]
)
def test_a_connection_closed_or_garbled_mid_reply_fails_its_batch_and_the_next_reconnects(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, fault: dict[str, int], why: str
) -> None:
    small_windows(monkeypatch, 1)
    fake = ScriptedRedis(**fault)
    store = open_store(fake.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(4)], [payload(i) for i in range(4)]
    try:
        run(loop, [(Op.STORE, keys, data)])
        outs = np.full((4, BLOCK), 0xAB, np.uint8)
        (result,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert why in (result.error or "")
        assert store.outages == 1 and not store.healthy
        for o, d, outcome in zip(outs, data, result.outcomes, strict=True):
            if outcome is ReadOutcome.HIT:
                assert np.array_equal(o, d)
            else:
                assert not o.any()
        assert ReadOutcome.MISS in result.outcomes  # the value cut short or garbled
        clock.now += 5.0
        (again,) = run(loop, [(Op.LOAD, keys, list(outs))])
        assert again.error is None and list(again.outcomes) == [ReadOutcome.HIT] * 4
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
    finally:
        loop.close()
        store.close()
        fake.close()


def test_a_value_header_is_checked_against_its_own_key_and_model() -> None:
    """The scripted server stores what the loop sends: the value is ``header ||
    payload`` in the block format, under the key's Redis name."""
    fake = ScriptedRedis()
    store = open_store(fake.url, Clock())
    loop = RemoteLoop(store, connections=1, name="test-loop")
    try:
        run(loop, [(Op.STORE, [key(3)], [payload(3)])])
        value = fake.values[store.redis_key(key(3))]
        size = store.header_size(32)
        header = block_format.verify(value[:size], value[size:], key=key(3), fingerprint=FP)
        assert header.payload_length == BLOCK and value[size:] == payload(3).tobytes()
    finally:
        loop.close()
        store.close()
        fake.close()


def test_a_store_without_plain_sockets_is_served_by_blocking_calls(
    server: RedisServer, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster or TLS store: the same thread runs each batch through ``write_many``,
    ``read_many_into`` and ``delete_many``, with the same outcomes."""
    monkeypatch.setattr(RemoteStore, "multiplexable", property(lambda self: False))
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(4)], [payload(i) for i in range(4)]
    try:
        assert run(loop, [(Op.STORE, keys, data)])[0].error is None
        assert run(loop, [(Op.DELETE, [keys[2]], [])])[0].error is None
        outs = np.full((5, BLOCK), 0xAB, np.uint8)
        (result,) = run(loop, [(Op.LOAD, [*keys, key(9)], list(outs))])
        hit, miss = ReadOutcome.HIT, ReadOutcome.MISS
        assert result.error is None and list(result.outcomes) == [hit, hit, miss, hit, miss]
        assert np.array_equal(outs[3], data[3]) and not outs[2].any() and not outs[4].any()
        server.kill()
        (down,) = run(loop, [(Op.LOAD, keys, list(outs[:4]))])
        assert "remote store failed" in (down.error or "") and not outs.any()
    finally:
        loop.close()
        store.close()


def test_an_idle_connection_is_readable_only_when_closed_or_out_of_step() -> None:
    """The check before an idle connection takes new requests (the loop may not have
    seen a close yet when a job comes in the same instant)."""
    a, b = socket.socketpair()
    with a, b:
        assert not redis_client.readable(a)
        b.sendall(b"+OK\r\n")  # a reply nobody asked for
        assert redis_client.readable(a)
        a.recv(16)
        b.close()
        assert redis_client.readable(a)


# -- regressions: each once broke the loop -----------------------------------------


def test_the_store_closed_under_the_loop_fails_nothing_and_the_thread_goes_on(
    server: RedisServer, clock: Clock
) -> None:
    """``store.close()`` (a later call reconnects) while the loop holds idle lent
    connections: the next batch reconnects and loads (a closed socket's ``fileno``
    of -1 once killed the loop's thread, and every later job hung)."""
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(6)], [payload(i) for i in range(6)]
    try:
        assert run(loop, [(Op.STORE, keys, data)])[0].error is None
        store.close()
        outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
        (result,) = run(loop, [(Op.LOAD, keys, outs)])
        assert result.error is None and all(o is ReadOutcome.HIT for o in result.outcomes)
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
    finally:
        loop.close()
        store.close()


def test_an_unforeseen_error_fails_the_batches_held_and_the_loop_goes_on(
    server: RedisServer, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    real, calls = remote_mux.Multiplexer._commands, [0]

    def commands(self: Any, values: list[Any]) -> list[Any]:
        calls[0] += 1
        if calls[0] == 1:  # the first batch's requests: a bug
            raise RuntimeError("a bug in the loop")
        return real(self, values)  # type: ignore[no-any-return]

    monkeypatch.setattr(remote_mux.Multiplexer, "_commands", commands)
    keys, data = [key(i) for i in range(4)], [payload(i) for i in range(4)]
    try:
        (first,) = run(loop, [(Op.STORE, keys, data)])
        assert "a bug in the loop" in (first.error or "")
        (second,) = run(loop, [(Op.STORE, keys, data)])  # a new thread's pass
        assert second.error is None
    finally:
        loop.close()
        store.close()


def test_a_refusal_after_a_lost_connection_does_not_mark_the_store_healthy(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """One value's connection is lost (a failure of the store), another value of the
    same batch is refused (``-OOM``): the batch fails and the store stays in its
    outage (the refusal once recorded a success, undoing the failure)."""
    small_windows(monkeypatch, 1)
    lost = threading.Event()

    class LosesThenRefuses(ScriptedRedis):
        def _serve(self, conn: socket.socket) -> None:
            with conn:
                stream = conn.makefile("rb")
                while (args := _read_command(stream)) is not None:
                    verb = args[0].upper()
                    if verb == b"HELLO":
                        conn.sendall(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                    elif verb == b"SET" and args[1].endswith(key(0).hex().encode()):
                        conn.shutdown(socket.SHUT_RDWR)
                        lost.set()
                        return
                    elif verb == b"SET":
                        lost.wait(30)
                        time.sleep(0.2)  # the loss is seen first (else: no outage to undo)
                        conn.sendall(b"-OOM command not allowed\r\n")
                    else:
                        conn.sendall(b"+OK\r\n")

    fake = LosesThenRefuses()
    store = open_store(fake.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    try:
        (result,) = run(loop, [(Op.STORE, [key(0), key(1)], [payload(0), payload(1)])])
        assert result.error is not None
        assert store.outages == 1 and not store.healthy
    finally:
        loop.close()
        store.close()
        fake.close()


def test_idle_connections_closed_while_the_loop_was_busy_are_polled_before_use(
    monkeypatch: pytest.MonkeyPatch, server: RedisServer, clock: Clock
) -> None:
    """The server closes the loop's idle connections while its thread runs a report
    (``on_done``), which queues the next load: the loop never selects in between, so
    only the zero-timeout poll of idle connections finds them closed. The load
    succeeds on new connections, with no outage."""
    small_windows(monkeypatch, 2)
    store = open_store(server.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    keys, data = [key(i) for i in range(6)], [payload(i) for i in range(6)]
    outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
    results: list[BatchResult] = []
    done = threading.Event()
    try:
        assert run(loop, [(Op.STORE, keys, data)])[0].error is None

        def in_loop(_: BatchResult) -> None:
            with server.client() as c:
                me = c.client_id()
                for client in c.client_list():
                    if int(client["id"]) != me:
                        c.client_kill_filter(_id=int(client["id"]))
                while any(int(client["id"]) != me for client in c.client_list()):
                    time.sleep(0.001)
            loop.submit(Op.LOAD, keys, outs, lambda r: (results.append(r), done.set()))

        loop.submit(Op.LOAD, [], [], in_loop)  # an empty batch: reported in the loop
        assert done.wait(60)
        assert results[0].error is None and store.outages == 0
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
    finally:
        loop.close()
        store.close()


@pytest.mark.parametrize("ttl_s", [None, 2.5])
def test_requests_of_stores_and_loads_filled_together_go_out_in_their_order(
    ttl_s: float | None,
) -> None:
    """One connection's fill may hold values of a store and of a load (one loop, both
    ways): each ``GET`` goes between the ``SET`` before and after it, byte for byte as
    RESP has them (the oracle is written out here, not ``set_commands``)."""
    options = RemoteOptions(url="redis://127.0.0.1:1/0", ttl_s=ttl_s)
    store = RemoteStore.open(FP, options, environ={})
    loop = RemoteLoop(store, connections=1, name="test-loop")
    mux = remote_mux.Multiplexer(loop)
    try:
        pages = [payload(i, 40) for i in range(3)]
        stores = remote_batches.Batch(Op.STORE, [key(0), key(1)], [], pages[:2], print)
        loads = remote_batches.Batch(Op.LOAD, [key(2)], [], pages[2:], print)
        for batch in (stores, loads):
            batch.names = [store.redis_key(k) for k in batch.keys]
        values = [remote_batches.Value(stores, 0), remote_batches.Value(loads, 0)]
        values.append(remote_batches.Value(stores, 1))
        sent = b"".join(bytes(b) for b in mux._commands(values))
    finally:
        mux.sel.close()
        loop.close()

    def bulk(data: bytes) -> bytes:
        return b"$%d\r\n%s\r\n" % (len(data), data)

    def set_(i: int) -> bytes:
        value = block_format.encode_header(key(i), FP, pages[i].data) + pages[i].tobytes()
        args = [b"SET", store.redis_key(key(i)), value]
        args += [] if ttl_s is None else [b"PX", b"2500"]
        return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)

    get = b"*2\r\n" + bulk(b"GET") + bulk(store.redis_key(key(2)))
    assert sent == set_(0) + get + set_(1)


def test_a_corrupt_value_is_deleted_by_a_request_on_the_loop_not_a_blocking_call(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the ``DEL`` of a corrupt value waits for its answer, the loop serves the
    next batch on its other connection (a blocking ``delete_many`` on the loop's thread
    held every batch for up to ``timeout_s``); the load that found the value is
    reported once it is deleted, so a value stored again after that report is never
    removed by a late ``DEL``."""
    small_windows(monkeypatch, 1)  # the next batch cannot queue behind the DEL
    fake = ScriptedRedis()
    store = open_store(fake.url, clock, timeout_s=300.0)
    bad = store.redis_key(key(1))
    fake.values[bad] = b"not a block"
    fake.hold_deletes.add(bad)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    reported = threading.Event()
    results: list[BatchResult] = []
    data = [payload(0), payload(2)]
    try:
        run(loop, [(Op.STORE, [key(0), key(2)], data)])
        outs = [np.full(BLOCK, 0xAB, np.uint8) for _ in range(3)]
        loop.submit(
            Op.LOAD, [key(0), key(1), key(2)], outs, lambda r: (results.append(r), reported.set())
        )
        deadline = time.monotonic() + 30
        while not fake.deleting:  # the DEL is in, unanswered
            assert time.monotonic() < deadline, "no DEL came"
            time.sleep(0.001)
        other, served = [np.zeros(BLOCK, np.uint8)], threading.Event()
        loop.submit(Op.LOAD, [key(2)], other, lambda r: served.set())
        assert served.wait(10), "the next batch waited for the DEL"
        assert np.array_equal(other[0], data[1])
        assert not reported.is_set() and fake.deleted == []
        fake.release.set()
        assert reported.wait(30)
        (loaded,) = results
        assert fake.deleted == [bad] and bad not in fake.values
        assert loaded.error is None
        assert list(loaded.outcomes) == [ReadOutcome.HIT, ReadOutcome.CORRUPT, ReadOutcome.HIT]
        assert np.array_equal(outs[0], data[0]) and np.array_equal(outs[2], data[1])
        assert not outs[1].any()
        (after,) = run(loop, [(Op.LOAD, [key(0), key(1)], outs[:2])])  # in step after the DEL
        assert list(after.outcomes) == [ReadOutcome.HIT, ReadOutcome.MISS]
        assert store.healthy and store.outages == 0
    finally:
        fake.release.set()
        loop.close()
        store.close()
        fake.close()


@pytest.mark.parametrize(("verb", "reply"), [(b"SET", b":1\r\n"), (b"DEL", b"+OK\r\n")])
def test_a_reply_that_is_not_the_commands_fails_its_batch_which_is_reported(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, verb: bytes, reply: bytes
) -> None:
    """A ``SET`` or ``DEL`` answered out of step (``:1``, ``+OK``): the connection is
    lost with every value waiting on it, the batch fails and is reported, the store
    records the failure (the value was once taken off the connection before its reply
    was checked: its batch was never reported, and the jobs after it waited for ever)."""
    small_windows(monkeypatch, 1)
    fake = ScriptedRedis()
    store = open_store(fake.url, clock)
    loop = RemoteLoop(store, connections=2, name="test-loop")
    try:
        if verb == b"SET":
            fake.odd[verb] = reply
            (result,) = run(loop, [(Op.STORE, [key(0)], [payload(0)])])
            assert "unexpected reply to SET" in (result.error or "")
        else:
            fake.values[store.redis_key(key(0))] = b"not a block"
            fake.odd[verb] = reply
            outs = [np.full(BLOCK, 0xAB, np.uint8)]
            (result,) = run(loop, [(Op.LOAD, [key(0)], outs)])
            # the load itself was answered: a corrupt value, its DEL lost (logged)
            assert list(result.outcomes) == [ReadOutcome.CORRUPT] and not outs[0].any()
        assert store.outages == 1 and not store.healthy
    finally:
        loop.close()
        store.close()
        fake.close()


def _queued(sock: socket.socket, request: int) -> int:
    """Bytes in a socket's queue: unread (``FIONREAD``) or unacknowledged (``TIOCOUTQ``)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0])


def test_a_reply_that_keeps_coming_slowly_does_not_time_out(
    conns: Callable[[int | None], list[Any]],
) -> None:
    """``remote_timeout_s`` bounds a connection's silence, not its reply: a value that
    comes in pieces, each well within the timeout, loads however long it takes in all.
    The loop's clock is moved by hand (0.6 of the timeout after each piece is read,
    4.2 timeouts in all), so no pause of this machine decides anything."""
    made = conns(None)
    fake = ScriptedRedis()
    store = open_store(fake.url, Clock(), timeout_s=100.0)
    clock = Clock()
    loop = RemoteLoop(store, connections=1, name="test-loop", clock=clock)
    data, out = payload(0), np.zeros(BLOCK, np.uint8)
    done = threading.Event()
    results: list[BatchResult] = []
    try:
        run(loop, [(Op.STORE, [key(0)], [data])])
        name = store.redis_key(key(0))
        reply = len(b"$%d\r\n\r\n" % len(fake.values[name])) + len(fake.values[name])
        fake.trickle[name] = 500
        loop.submit(Op.LOAD, [key(0)], [out], lambda r: (results.append(r), done.set()))
        (client,), server = made, fake.socks[-1]
        for _ in range(0, reply, 500):
            if done.is_set():  # ended early: failed
                break
            fake.piece.release()
            assert fake.piece_sent.acquire(timeout=30)
            deadline = time.monotonic() + 30
            while not done.is_set() and (
                _queued(server, termios.TIOCOUTQ) or _queued(client.raw, termios.FIONREAD)
            ):  # the piece is read, after the loop's event for it
                assert time.monotonic() < deadline, "a piece was never read"
                time.sleep(0.001)
            clock.now += 60.0
        assert done.wait(30)
        (result,) = results
        assert result.error is None and list(result.outcomes) == [ReadOutcome.HIT]
        assert np.array_equal(out, data) and clock.now == 420.0 and store.healthy
    finally:
        fake.close()
        loop.close()
        store.close()
