"""RESP on a socket kvtier owns: commands out without copying a page, replies in
straight into the caller's buffers.

Runs in whatever thread holds the connection; imports no torch. A block value goes
out as its header and its CPU page, two buffers, never joined (``BlockValue``,
``send_buffers``); a ``GET`` reply is read by ``ReplyReader`` from the kernel into the
page itself, one copy. A reply that breaks the protocol, or a connection closed in the
middle of one, raises ``ConnectionError``: the connection is out of step and must be
dropped. RESP2 and RESP3 replies are both understood (nil ``$-1`` and null ``_``).
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any


class ErrorReply(Exception):
    """The server answered a command with an error (``-OOM ...``, ``-NOPERM ...``);
    the connection is still in step. The message is the server's, without its ``-``."""


@dataclass(frozen=True, slots=True)
class BlockValue:
    """One stored value, ``header || payload``, as two buffers (nothing joined yet).

    Attributes:
        header: the encoded block header.
        payload: the block's bytes, a flat ``uint8`` memoryview (of a CPU page).
    """

    header: bytes
    payload: memoryview

    @property
    def nbytes(self) -> int:
        return len(self.header) + self.payload.nbytes

    def joined(self) -> bytes:
        """The value as one ``bytes`` (one copy), for redis-py's cluster client."""
        return b"".join((self.header, self.payload))


def command(*args: bytes | str | int) -> bytes:
    """One command in RESP (``*n``, then each argument as a bulk string)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out += [b"$%d\r\n" % len(data), data, b"\r\n"]
    return b"".join(out)


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def send_buffers(sock: socket.socket, buffers: list[bytes | memoryview]) -> None:
    """Write every buffer to ``sock``, in order, none of them copied.

    One ``sendmsg`` takes as many buffers as the kernel allows (``IOV_MAX``) and
    sends what its socket buffer holds; a partial send resumes where it stopped. A
    ``sendall`` per buffer would be three system calls per value, each handing the GIL
    back and forth. A TLS socket has no ``sendmsg``; it gets one ``sendall`` per buffer.

    Raises:
        OSError: the socket failed or timed out (``socket.timeout``).
    """
    if isinstance(sock, ssl.SSLSocket):
        for b in buffers:
            sock.sendall(b)
        return
    views = [memoryview(b).cast("B") for b in buffers]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + _IOV_MAX])
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


SCATTER_TAIL = 4096
"""Bytes after a large value read into the read buffer in the same call (its CRLF,
the next reply's line and header, and a little more)."""


def _scatters(sock: Any) -> bool:
    """Whether ``sock`` reads into several buffers at once (TLS sockets do not)."""
    return not isinstance(sock, ssl.SSLSocket) and hasattr(sock, "recvmsg_into")


class ReplyReader:
    """Reads replies from a blocking socket, a value straight into the caller's
    buffers (no intermediate copy).

    A parser that builds a ``bytes`` per reply copies a large value twice before
    Python sees it (into the parser's buffer, then into the ``bytes``); this reader
    copies it once, from the kernel into the CPU page. The caller owns the connection
    until every reply it asked for is read, and drops it if reading fails half-way.
    """

    def __init__(self, sock: Any, buffer_bytes: int = 1 << 16) -> None:
        self._sock = sock
        self._buf = bytearray(buffer_bytes)
        self._start = 0
        self._end = 0
        self._scatter = _scatters(sock)

    def fill(self) -> None:
        """One ``recv`` into the buffer (at least a byte; as the socket's mark allows)."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            kept = self._end - self._start
            self._buf[:kept] = self._buf[self._start : self._end]
            self._start, self._end = 0, kept
        got = self._sock.recv_into(memoryview(self._buf)[self._end :])
        if not got:
            raise ConnectionError("the server closed the connection mid-reply")
        self._end += got

    def line(self) -> bytes:
        """One reply line without its CRLF (``$123``, ``$-1``, ``-WRONGTYPE ...``)."""
        while True:
            i = self._buf.find(b"\r\n", self._start, self._end)
            if i >= 0:
                out = bytes(self._buf[self._start : i])
                self._start = i + 2
                return out
            if self._start == 0 and self._end == len(self._buf):
                raise ConnectionError("a reply line longer than the read buffer")
            self.fill()

    def take_if(self, expected: bytes) -> bool:
        """Whether the stream goes on with ``expected``: if so it is consumed, if not
        nothing is (read on with ``line``). Reads only as far as it takes to know;
        ``False`` for more bytes than the read buffer holds."""
        n = len(expected)
        if n > len(self._buf):
            return False
        while self._end - self._start < n:
            if not expected.startswith(self._buf[self._start : self._end]):
                return False
            self.fill()
        if self._buf[self._start : self._start + n] != expected:
            return False
        self._start += n
        return True

    def read_into(self, *views: memoryview) -> None:
        """Exactly the bytes of ``views``, in order, from the stream (a value's header,
        its payload and its CRLF in one call).

        What is buffered is copied first. If the rest fits in the read buffer (a
        header, a CRLF) it goes through it: one ``recv`` then brings what follows too.
        A larger rest is read straight from the socket, scattered (``recvmsg_into``)
        into the views and on into the emptied read buffer: the same system call
        brings the value's CRLF and the next reply's line and header (at most
        ``SCATTER_TAIL`` bytes past the views: the next value's payload is better read
        straight into its own page), 1.2-1.7 ``recv`` calls per 256 KiB value instead
        of 3. Empty views are skipped (reading into one would return 0, which reads as
        a closed connection).
        """
        rest = [v for v in views if len(v)]
        while rest and self._end > self._start:  # what is buffered, one copy
            v = rest[0]
            n = min(len(v), self._end - self._start)
            v[:n] = memoryview(self._buf)[self._start : self._start + n]
            self._start += n
            if n == len(v):
                del rest[0]
            else:
                rest[0] = v[n:]
        if not rest:
            return
        want = sum(len(v) for v in rest)
        if want <= len(self._buf):  # small: through the read buffer
            self._start = self._end = 0
            while self._end < want:
                self.fill()
            self.read_into(*rest)
            return
        self._start = self._end = 0  # everything buffered was taken: the buffer is free
        tail = [memoryview(self._buf)[:SCATTER_TAIL]] if self._scatter else []
        while rest:
            if self._scatter:
                got = self._sock.recvmsg_into(rest + tail)[0]
            else:
                got = self._sock.recv_into(rest[0])
            if not got:
                raise ConnectionError("the server closed the connection mid-reply")
            while rest and got >= len(rest[0]):
                got -= len(rest.pop(0))
            if rest:
                rest[0] = rest[0][got:]
            else:
                self._end = got  # the rest went on into the read buffer

    def skip(self, nbytes: int) -> None:
        """Discard ``nbytes`` of the stream."""
        scratch = memoryview(bytearray(min(nbytes, 1 << 20)))
        while nbytes:
            step = min(nbytes, len(scratch))
            self.read_into(scratch[:step])
            nbytes -= step

    def reply(self) -> bytes | int | ErrorReply | None:
        """One reply to a command that answers a status, an integer, an error or a
        short bulk string (``PING``, ``AUTH``, ``EXISTS``, ``DEL``): the status or the
        string as ``bytes``, ``None`` for nil, the error as an ``ErrorReply`` value.

        Raises:
            ConnectionError: any other reply (the stream is out of step).
        """
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return ErrorReply(rest.decode(errors="replace"))
        if line in (b"$-1", b"_"):
            return None
        try:
            if kind == b":":
                return int(rest)
            if kind == b"$":
                value = bytearray(int(rest) + 2)
                self.read_into(memoryview(value))
                if value[-2:] != b"\r\n":
                    raise ConnectionError("a bulk reply not ended by CRLF")
                return bytes(value[:-2])
        except ValueError:
            pass
        raise ConnectionError(f"unexpected reply: {line[:40]!r}")
