"""RemoteStore against a server whose replies are wrong: a garbled, cut-short or
refusing reply to ``SET`` or ``GET`` fails the batch and is counted by the breaker
(a refusal is not an outage), and never leaves plausible bytes in a page.

The server here is a few lines of RESP over a loopback socket: it answers every
command ``+OK`` except the one under test, whose reply the test scripts. The real
server's behaviour is tested in ``test_remote.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from kvtier.errors import TransferError
from kvtier.media import block_format, remote_values
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore
from kvtier.media.remote_values import replies_awaited

FP = b"\x55" * 32
BLOCK = 4096

Reply = Callable[[int], bytes | None]
"""The reply to the n-th scripted command (from 0); ``None`` closes the connection."""


class ScriptedServer:
    """Answers ``PING`` with ``+PONG`` and ``+OK`` to every other command but
    ``command``, whose replies ``reply`` gives."""

    def __init__(self, command: bytes, reply: Reply) -> None:
        self.command, self.reply = command, reply
        self.received: list[list[bytes]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        scripted = 0
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            # a client drops a connection it found out of step, its replies unread: the
            # reset that makes is the end of that connection, nothing more
            with conn, contextlib.suppress(ConnectionResetError):
                stream = conn.makefile("rb")
                while (args := _read_command(stream)) is not None:
                    self.received.append(args)
                    if args[0].upper() == b"PING":
                        conn.sendall(b"+PONG\r\n")
                        continue
                    if args[0].upper() != self.command:
                        conn.sendall(b"+OK\r\n")
                        continue
                    out = self.reply(scripted)
                    scripted += 1
                    if out is None:
                        break
                    conn.sendall(out)

    def close(self) -> None:
        self._listener.close()


def _read_command(stream: object) -> list[bytes] | None:
    line = stream.readline()  # type: ignore[attr-defined]
    if not line:
        return None
    assert line.startswith(b"*"), line
    args = []
    for _ in range(int(line[1:])):
        size = int(stream.readline()[1:])  # type: ignore[attr-defined]
        args.append(stream.read(size + 2)[:-2])  # type: ignore[attr-defined]
    return args


@pytest.fixture
def last_server() -> list[ScriptedServer]:
    return []


@pytest.fixture
def serve(last_server: list[ScriptedServer]) -> Iterator[Callable[[bytes, Reply], RemoteStore]]:
    servers = last_server
    stores: list[RemoteStore] = []

    def make(command: bytes, reply: Reply) -> RemoteStore:
        servers.append(ScriptedServer(command, reply))
        options = RemoteOptions(url=servers[-1].url, timeout_s=2.0)
        stores.append(RemoteStore.open(FP, options, environ={}))
        return stores[-1]

    yield make
    for s in stores:
        s.close()
    for server in servers:
        server.close()


def key(i: int) -> bytes:
    return bytes([i]) * 32


def pages(n: int) -> list[np.ndarray]:
    return [np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8) for i in range(n)]


@pytest.mark.parametrize(
    "bad",
    [
        b":1\r\n",  # an integer
        b"$2\r\nOK\r\n",  # a bulk string
        b"+QUEUED\r\n",  # another status
        b"+O",  # cut short, then closed
        None,  # closed before any reply
    ],
)
def test_a_wrong_reply_to_set_fails_the_batch_and_is_an_outage(
    serve: Callable[[bytes, Reply], RemoteStore], bad: bytes | None
) -> None:
    store = serve(b"SET", lambda n: b"+OK\r\n" if n != 2 else bad)
    with pytest.raises(TransferError, match="remote store failed"):
        store.write_many([key(i) for i in range(4)], pages(4))
    assert not store.healthy
    assert store.outages == 1


def test_a_refused_set_fails_the_batch_but_not_the_store(
    serve: Callable[[bytes, Reply], RemoteStore],
) -> None:
    oom = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
    store = serve(b"SET", lambda n: oom if n in (1, 3) else b"+OK\r\n")
    with pytest.raises(TransferError, match="2 of 4 values refused: OOM command not allowed"):
        store.write_many([key(i) for i in range(4)], pages(4))
    assert store.healthy
    store.write_many([key(9)], pages(1))  # the connection is still in step


def test_every_value_of_a_batch_reaches_the_server_whole(
    serve: Callable[[bytes, Reply], RemoteStore], last_server: list[ScriptedServer]
) -> None:
    store = serve(b"SET", lambda n: b"+OK\r\n")
    data = pages(5)
    store.write_many([key(i) for i in range(5)], data)
    sets = [args for args in last_server[0].received if args[0] == b"SET"]
    assert [args[1] for args in sets] == [store.redis_key(key(i)) for i in range(5)]
    for i, args in enumerate(sets):
        assert len(args) == 3  # no TTL asked for
        value = memoryview(args[2])
        size = len(args[2]) - BLOCK
        block_format.verify(value[:size], value[size:], key=key(i), fingerprint=FP)
        assert bytes(value[size:]) == data[i].tobytes()


@pytest.mark.parametrize(
    "bad",
    [
        b"$%d\r\nshort" % (BLOCK + 200),  # a value cut short, then closed
        b"*1\r\n$1\r\nx\r\n",  # an array
        b"+OK\r\n",  # a status
        None,  # closed
    ],
)
def test_a_wrong_reply_to_get_fails_and_leaves_every_page_zeroed(
    serve: Callable[[bytes, Reply], RemoteStore], bad: bytes | None
) -> None:
    store = serve(b"GET", lambda n: b"$-1\r\n" if n == 0 else bad)
    outs = [np.full(BLOCK, 0xAB, dtype=np.uint8) for _ in range(3)]
    with pytest.raises(TransferError, match="remote store failed"):
        store.read_many_into([key(i) for i in range(3)], outs)
    assert not any(o.any() for o in outs)
    assert not store.healthy
    assert store.outages == 1


def test_a_miss_reply_is_a_miss(serve: Callable[[bytes, Reply], RemoteStore]) -> None:
    store = serve(b"GET", lambda n: b"$-1\r\n")
    outs = [np.full(BLOCK, 0xAB, dtype=np.uint8) for _ in range(2)]
    assert store.read_many_into([key(1), key(2)], outs) == [ReadOutcome.MISS] * 2
    assert not any(o.any() for o in outs)
    assert store.healthy


def low_water(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback TCP socket and its peer."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sock = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        with sock, peer:
            yield sock, peer


def test_replies_awaited_raises_the_low_water_mark_and_always_restores_it(
    tcp_pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, _ = tcp_pair
    with replies_awaited(sock, 40):
        assert low_water(sock) == 40
    assert low_water(sock) == 1
    with pytest.raises(TimeoutError), replies_awaited(sock, 15):
        raise TimeoutError  # a read that failed half-way
    assert low_water(sock) == 1


def test_the_reader_wakes_once_every_reply_of_the_batch_is_in(
    tcp_pair: tuple[socket.socket, socket.socket],
) -> None:
    """Under the mark a poll does not report the socket readable until the batch's
    replies are all there: three of four ``+OK`` time out, the fourth wakes it."""
    sock, peer = tcp_pair
    sock.settimeout(0.2)
    with replies_awaited(sock, 20):
        peer.sendall(b"+OK\r\n" * 3)
        with pytest.raises(TimeoutError):
            sock.recv(64)
        peer.sendall(b"+OK\r\n")
        assert sock.recv(64) == b"+OK\r\n" * 4


def test_a_refused_set_in_the_middle_of_a_batch_fails_exactly_that_value(
    serve: Callable[[bytes, Reply], RemoteStore], last_server: list[ScriptedServer]
) -> None:
    """One ``-ERR`` among eight ``+OK`` (read under the raised mark): the batch fails
    naming one refusal, the other seven reached the server, the store is healthy
    and its connection in step."""
    store = serve(b"SET", lambda n: b"-ERR value refused\r\n" if n == 4 else b"+OK\r\n")
    with pytest.raises(TransferError, match="1 of 8 values refused: ERR value refused"):
        store.write_many([key(i) for i in range(8)], pages(8))
    assert store.healthy
    store.write_many([key(9)], pages(1))
    sets = [args[1] for args in last_server[0].received if args[0] == b"SET"]
    assert sets == [store.redis_key(key(i)) for i in (*range(8), 9)]


def test_a_store_reads_its_replies_under_the_mark_of_its_batch(
    serve: Callable[[bytes, Reply], RemoteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``set_from_pages`` reads a batch's replies with the mark at five bytes a value
    (``+OK\\r\\n``), on the connection's TCP socket."""
    marks: list[int] = []

    @contextlib.contextmanager
    def spy(sock: socket.socket, nbytes: int) -> Iterator[None]:
        with replies_awaited(sock, nbytes):
            marks.append(low_water(sock))
            yield

    monkeypatch.setattr(remote_values, "replies_awaited", spy)
    store = serve(b"SET", lambda n: b"+OK\r\n")
    store.write_many([key(i) for i in range(6)], pages(6))
    assert marks == [30]


def test_a_batch_whose_replies_outgrow_the_read_buffer_is_stored_at_once(
    serve: Callable[[bytes, Reply], RemoteStore],
) -> None:
    """900 ``+OK`` (4,500 bytes) fill the 4,096-byte read buffer and leave 404 bytes:
    read under the batch's mark, that rest never woke the reader and the batch waited
    out the 2 s timeout as an outage. The mark holds for the first read only."""
    store = serve(b"SET", lambda n: b"+OK\r\n")
    store.write_many([i.to_bytes(32, "big") for i in range(900)], pages(1) * 900)
    assert store.healthy and store.breaker.failures == 0


def test_replies_split_by_a_refusal_and_a_pause_are_read_without_waiting(
    serve: Callable[[bytes, Reply], RemoteStore],
) -> None:
    """Seven replies (one a 20-byte refusal) come first, the eighth after a pause:
    the first read takes the seven (>= the 40-byte mark), and the last 5 bytes, under
    the mark, would have waited out the timeout. The batch names its one refusal."""

    def reply(n: int) -> bytes:
        if n == 7:
            time.sleep(0.2)
        return b"-ERR value refused\r\n" if n == 4 else b"+OK\r\n"

    store = serve(b"SET", reply)
    with pytest.raises(TransferError, match="1 of 8 values refused: ERR value refused"):
        store.write_many([key(i) for i in range(8)], pages(8))
    assert store.healthy and store.breaker.failures == 0
