"""The wire pieces of the remote tier, without a server: commands are RESP as the
protocol writes it, ``ReplyReader`` reads replies however the kernel splits them, and
loads keep their window of requests."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from kvtier.media import block_format, remote_values
from kvtier.media.block_codec import PlainCodec
from kvtier.media.resp import BlockValue, ErrorReply, ReplyReader, command, send_buffers


def joined(chunks: list) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def resp(*args: bytes) -> bytes:
    """RESP of one command, written out from the protocol (the oracle)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_command_is_resp_of_its_arguments() -> None:
    assert command(b"PING") == b"*1\r\n$4\r\nPING\r\n"
    assert command(b"SELECT", 12) == b"*2\r\n$6\r\nSELECT\r\n$2\r\n12\r\n"
    assert command("AUTH", "al ice", b"p\r\nw") == resp(b"AUTH", b"al ice", b"p\r\nw")


@pytest.mark.parametrize("step", [1, 3, 4096])
def test_reply_reads_each_simple_kind(step: int) -> None:
    """Statuses, errors (as values), integers, nil in RESP2 and RESP3, short bulk
    strings (one with a CRLF inside); anything else is a stream out of step."""
    data = b"+PONG\r\n-NOAUTH need one\r\n:7\r\n:-2\r\n$-1\r\n_\r\n$4\r\na\r\nb\r\n*1\r\n"
    sock, t = serve(data, step)
    reader = ReplyReader(sock, buffer_bytes=64)
    got = [reader.reply() for _ in range(7)]
    assert got[0] == b"PONG" and isinstance(got[1], ErrorReply) and str(got[1]) == "NOAUTH need one"
    assert got[2:] == [7, -2, None, None, b"a\r\nb"]
    with pytest.raises(ConnectionError, match="unexpected reply"):
        reader.reply()
    t.join()
    sock.close()


@pytest.mark.parametrize("bad", [b":x\r\n", b"$x\r\n", b"$-5\r\n", b"$1\r\nabc\r\n"])
def test_a_malformed_simple_reply_is_a_stream_out_of_step(bad: bytes) -> None:
    sock, t = serve(bad, 4096)
    with pytest.raises(ConnectionError):
        ReplyReader(sock, buffer_bytes=64).reply()
    t.join()
    sock.close()


def serve(data: bytes, step: int) -> tuple[socket.socket, threading.Thread]:
    """A socket whose peer sends ``data`` in pieces of ``step`` bytes, then closes."""
    a, b = socket.socketpair()

    def send() -> None:
        for i in range(0, len(data), step):
            b.sendall(data[i : i + step])
        b.close()

    t = threading.Thread(target=send)
    t.start()
    return a, t


class RecvOnly:
    """A socket that reads into one buffer at a time (as a TLS socket does)."""

    def __init__(self, sock: socket.socket) -> None:
        self.recv_into = sock.recv_into


@pytest.mark.parametrize("scatter", [True, False])
@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_reader_reads_lines_and_values_across_any_split(step: int, scatter: bool) -> None:
    """A value larger than the read buffer is read straight into its buffer, and
    (``recvmsg_into``) what follows it on into the read buffer in the same call."""
    payload = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    data = b"$-1\r\n_\r\n-WRONGTYPE x\r\n$%d\r\n%s\r\n$3\r\nabc\r\n" % (len(payload), payload)
    sock, t = serve(data, step)
    reader = ReplyReader(sock if scatter else RecvOnly(sock), buffer_bytes=64)
    assert [reader.line() for _ in range(4)] == [b"$-1", b"_", b"-WRONGTYPE x", b"$200000"]
    out = bytearray(len(payload))
    reader.read_into(memoryview(out))
    assert out == payload
    reader.skip(2)
    assert reader.line() == b"$3"
    reader.skip(5)
    with pytest.raises(ConnectionError):
        reader.line()  # the peer closed
    t.join()
    sock.close()


@pytest.mark.parametrize("step", [1, 3, 5, 4096])
def test_take_if_consumes_only_what_matches_across_any_split(step: int) -> None:
    """``take_if`` (the store path's all-``+OK`` check) consumes its bytes only when
    the stream goes on with all of them; otherwise ``line`` reads from where it was.
    It reads no further than it takes to know (the last reply is shorter than what
    is asked, and then the peer closes)."""
    ok = b"+OK\r\n"
    sock, t = serve(ok * 3 + b"-OOM no room\r\n" + ok * 3 + b"-X\r\n", step)
    reader = ReplyReader(sock, buffer_bytes=64)
    assert not reader.take_if(ok * 4)  # the fourth reply is an error
    assert reader.take_if(ok * 2)
    assert reader.line() == b"+OK"
    assert not reader.take_if(ok)
    assert reader.line() == b"-OOM no room"
    assert not reader.take_if(ok * 13)  # more than the read buffer: not tried
    assert reader.take_if(ok * 3)
    assert not reader.take_if(ok * 2)  # known at its first byte: no wait for more
    assert reader.line() == b"-X"
    with pytest.raises(ConnectionError):
        reader.take_if(ok)  # the peer closed
    t.join()
    sock.close()


class CountingRecvOnly:
    """A socket that counts its reads, each into one buffer (as a TLS socket)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.reads = sock, 0

    def recv_into(self, view: memoryview) -> int:
        self.reads += 1
        return self.sock.recv_into(view)


class Counting(CountingRecvOnly):
    """A socket that counts its reads, and scatters them (``recvmsg_into``)."""

    def recvmsg_into(self, views: list[memoryview]) -> tuple[int, list, int, object]:
        self.reads += 1
        return self.sock.recvmsg_into(views)


@pytest.mark.parametrize("kind", [Counting, CountingRecvOnly])
def test_a_value_that_ends_where_a_read_ends_leaves_no_stale_bytes(kind: type) -> None:
    """The value's last bytes arrive alone (the peer pauses after them): the next
    reply is read from the stream, not from what the read buffer held before; its
    CRLF and the next line come in one read."""
    payload = bytes(range(256)) * 40
    a, b = socket.socketpair()
    b.sendall(b"$%d\r\n" % len(payload) + payload)
    sock = kind(a)
    reader = ReplyReader(sock, buffer_bytes=64)
    assert reader.line() == b"$%d" % len(payload)
    out = bytearray(len(payload))
    reader.read_into(memoryview(out))
    assert out == payload
    b.sendall(b"\r\n$2\r\nok\r\n")
    b.close()
    crlf = bytearray(2)
    reads = sock.reads
    reader.read_into(memoryview(crlf))
    assert crlf == b"\r\n" and reader.line() == b"$2"
    assert sock.reads == reads + 1
    a.close()


def test_small_reads_go_through_the_read_buffer() -> None:
    """Lines, headers and CRLFs of replies that are all in come from one read."""
    a, b = socket.socketpair()
    b.sendall(b"$5\r\nhello\r\n" * 4)
    sock = Counting(a)
    reader = ReplyReader(sock, buffer_bytes=4096)
    for _ in range(4):
        value, crlf = bytearray(5), bytearray(2)
        assert reader.line() == b"$5"
        reader.read_into(memoryview(value))
        reader.read_into(memoryview(crlf))
        assert value == b"hello" and crlf == b"\r\n"
    assert sock.reads == 1
    a.close()
    b.close()


def test_send_buffers_sends_every_byte_in_order_through_partial_sends() -> None:
    rng = np.random.default_rng(1)
    # More buffers than one sendmsg takes (IOV_MAX), some empty, and far more bytes
    # than a socket buffer holds: sendmsg returns part-way through a buffer.
    buffers: list[bytes | memoryview] = []
    for i in range(3000):
        n = 0 if i % 97 == 0 else int(rng.integers(1, 2000))
        buffers.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    big = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    buffers.insert(1500, big.data.cast("B"))
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.settimeout(10.0)  # as the store's sockets: non-blocking inside, so sends are partial
    got = bytearray()

    def drain() -> None:
        while chunk := b.recv(5000):
            got.extend(chunk)

    t = threading.Thread(target=drain)
    t.start()
    send_buffers(a, buffers)
    a.close()
    t.join()
    b.close()
    assert got == joined(buffers)


@pytest.mark.parametrize("scatter", [True, False])
@pytest.mark.parametrize("step", [1, 5, 97, 4096, 1 << 20])
def test_read_into_fills_several_views_in_order_across_any_split(step: int, scatter: bool) -> None:
    """A header, a payload and a CRLF in one call (``receive``'s use), some smaller and
    some larger than the read buffer, an empty one among them; then the next reply."""
    rng = np.random.default_rng(2)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (40, 0, 9000, 2, 70)]
    data = b"".join(parts) + b"$1\r\nx\r\n"
    sock, t = serve(data, step)
    reader = ReplyReader(sock if scatter else RecvOnly(sock), buffer_bytes=64)
    outs = [bytearray(len(p)) for p in parts]
    reader.read_into(*(memoryview(o) for o in outs))
    assert outs == parts
    assert reader.line() == b"$1"
    t.join()
    sock.close()


class WindowSocket:
    """A connection's socket to a server that answers ``GET`` with the stored block of
    that key, checking that the client never has more than ``window`` requests
    unanswered (counted in replies not yet wholly received) and never reads a reply
    it did not ask for. Replies come ``step`` bytes at most per read."""

    def __init__(self, values: dict[bytes, bytes], window: int, step: int) -> None:
        self.values, self.window, self.step = values, window, step
        self.asked: list[bytes] = []
        self.out = bytearray()  # the replies to what was asked, in order
        self.ends: list[int] = []  # where each reply ends in ``out``
        self.sent = 0  # bytes of ``out`` received by the client

    def sendall(self, data: bytes) -> None:
        parts = bytes(data).split(b"\r\n")
        while parts and parts[0]:
            assert parts[:3] == [b"*2", b"$3", b"GET"], parts[:3]
            name = parts[4]
            parts = parts[5:]
            value = self.values[name]
            self.asked.append(name)
            self.out += b"$%d\r\n%s\r\n" % (len(value), value)
            self.ends.append(len(self.out))
            answered = sum(end <= self.sent for end in self.ends)
            assert len(self.asked) - answered <= self.window, "more requests outstanding"

    def _take(self, room: int) -> bytes:
        n = min(room, self.step, len(self.out) - self.sent)
        assert n > 0, "a read of a reply that was never asked for (it would wait forever)"
        self.sent += n
        return bytes(self.out[self.sent - n : self.sent])

    def recv_into(self, view: memoryview) -> int:
        got = self._take(len(view))
        view[: len(got)] = got
        return len(got)

    def recvmsg_into(self, views: list[memoryview]) -> tuple[int, list, int, None]:
        got = self._take(sum(len(v) for v in views))
        at = 0
        for v in views:
            n = min(len(v), len(got) - at)
            v[:n] = got[at : at + n]
            at += n
        return len(got), [], 0, None


class OneConnection:
    """``Connections`` with one connection over ``sock``."""

    def __init__(self, sock: WindowSocket) -> None:
        self.conn = type("Conn", (), {"sock": sock})()

    @contextlib.contextmanager
    def owned(self) -> Iterator[object]:
        yield self.conn


@pytest.mark.parametrize("step", [7, 1 << 20])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize("value_bytes", [1000, 200_000, 400_000])
def test_loads_keep_at_most_the_window_outstanding_and_ask_each_key_once(
    value_bytes: int, count: int, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``get_into_pages`` asks for every key once, in order, with never more than
    ``get_window`` requests unanswered (windows of 1, 2 and all), and reads every
    block back whole."""
    monkeypatch.setattr(remote_values, "WINDOW_BYTES", 500_000)
    window = remote_values.get_window(value_bytes)
    assert window == {1000: 500, 200_000: 2, 400_000: 1}[value_bytes]
    fp = b"\x09" * 32
    rng = np.random.default_rng(value_bytes + count)
    pages = rng.integers(0, 256, (count, value_bytes), dtype=np.uint8)
    keys = [bytes([i]) * 32 for i in range(count)]
    names = [b"name-%d" % i for i in range(count)]
    values = {
        n: block_format.encode_header(k, fp, p.data) + p.tobytes()
        for n, k, p in zip(names, keys, pages, strict=True)
    }
    sock = WindowSocket(values, window, step)
    outs = np.zeros_like(pages)
    batch = list(zip(keys, names, outs, strict=True))
    got = remote_values.get_into_pages(OneConnection(sock), codec=PlainCodec(fp), batch=batch)  # type: ignore[arg-type]
    assert got == [remote_values.ReadOutcome.HIT] * count
    assert sock.asked == names and sock.sent == len(sock.out)
    assert np.array_equal(outs, pages)


@pytest.mark.parametrize("px", [None, 7, 123_456_789])
@pytest.mark.parametrize("count", [1, 3])
def test_set_commands_are_resp_of_set_without_copying_a_page(count: int, px: int | None) -> None:
    """``set_commands`` (the store path's own formatting) sends, byte for byte, RESP of
    ``SET name header+page [PX px]``, each page as itself."""
    rng = np.random.default_rng(count)
    pages = [rng.integers(0, 256, 10_000 + i, dtype=np.uint8) for i in range(count)]
    batch = [
        (b"kvtier:v1:%d" % (10**i), BlockValue(b"H%d" % i * 30, p.data.cast("B")))
        for i, p in enumerate(pages)
    ]
    ttl = () if px is None else (b"PX", b"%d" % px)
    expected = b"".join(resp(b"SET", name, value.joined(), *ttl) for name, value in batch)
    buffers = remote_values.set_commands(batch, px)
    assert joined(buffers) == expected
    assert [any(b is v.payload for b in buffers) for _, v in batch] == [True] * count


class NoConnections:
    """``Connections`` that an empty batch must not touch."""

    def owned(self) -> Iterator[object]:
        raise AssertionError("an empty batch took a connection")


@pytest.mark.parametrize("px", [None, 7])
def test_an_empty_batch_has_no_set_commands(px: int | None) -> None:
    assert remote_values.set_commands([], px) == []


def test_an_empty_batch_of_stores_sends_nothing() -> None:
    assert remote_values.set_from_pages(NoConnections(), batch=[], px=7) == []  # type: ignore[arg-type]


def test_an_empty_batch_of_loads_sends_nothing() -> None:
    got = remote_values.get_into_pages(NoConnections(), codec=PlainCodec(b"\x09" * 32), batch=[])  # type: ignore[arg-type]
    assert got == []


@pytest.mark.parametrize("kind", [Counting, CountingRecvOnly])
def test_reading_only_empty_views_reads_nothing(kind: type) -> None:
    """Nothing buffered, nothing asked: no read (the stream has nothing to give yet)."""
    a, b = socket.socketpair()
    sock = kind(a)
    reader = ReplyReader(sock, buffer_bytes=64)
    reader.read_into(memoryview(bytearray(0)), memoryview(bytearray(0)))
    reader.read_into()
    assert sock.reads == 0
    b.sendall(b"$1\r\n")
    assert reader.line() == b"$1"
    a.close()
    b.close()


@pytest.mark.parametrize("scatter", [True, False])
@pytest.mark.parametrize("sizes", [(0, 9000, 2), (0, 0, 9000), (9000, 0), (0, 40), (0, 40, 0)])
def test_empty_views_anywhere_are_skipped_on_either_path(
    sizes: tuple[int, ...], scatter: bool
) -> None:
    """An empty view first, with nothing buffered, before a rest larger than the read
    buffer (read straight from the socket) or smaller (through it): read, not taken for
    a closed connection."""
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    sock, t = serve(b"".join(parts) + b"$1\r\nx\r\n", 4096)
    reader = ReplyReader(sock if scatter else RecvOnly(sock), buffer_bytes=64)
    outs = [bytearray(len(p)) for p in parts]
    reader.read_into(*(memoryview(o) for o in outs))
    assert outs == parts
    assert reader.line() == b"$1"
    t.join()
    sock.close()
