"""``LoopConnection``: one non-blocking connection of ``RemoteLoop``, and the bytes on it.

Runs in a ``RemoteLoop``'s thread (worker side); imports no torch. It holds what is
still to be sent (``send`` / ``flush``: ``sendmsg`` of as many buffers as the socket
takes now, none copied), the values whose replies it waits for (in order: the loop's),
and the reply being read: a line (``line``, read ``TAIL_BYTES`` at a time, so that a
value's payload is not read into the read buffer first), a value's views (``fill``:
what is buffered is copied, the rest read straight into the views and up to
``TAIL_BYTES`` past them into the emptied read buffer, which brings the next reply's
line and header in the same call) or bytes to discard (``discard``). Each returns
False when the socket has nothing more now (``drained``: a read shorter than asked,
or ``EAGAIN``); the loop then goes back to ``select`` (level-triggered), so a short
read never loses bytes. A closed connection raises ``ConnectionError``.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable
from typing import Any

from kvtier.media.redis_client import RedisConnection

READ_BUFFER_BYTES = 1 << 16
"""Each connection's read buffer (reply lines, headers; payloads skip it)."""
TAIL_BYTES = 4096
"""Bytes read past a value's views into the read buffer in the same call."""
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class LoopConnection:
    """One non-blocking connection: what it has to send, the values it waits for, and
    where the reply being read goes."""

    def __init__(
        self, link: RedisConnection, timeout_s: float, release: Callable[[], None]
    ) -> None:
        self.link = link  # ours until closed
        self.release = release
        self.sock: socket.socket = link.sock
        self.sock.setblocking(False)
        self.timeout_s = timeout_s
        self.out: list[Any] = []  # buffers still to send, in order
        self.waiting: collections.deque[Any] = collections.deque()  # the loop's values
        self.buf = bytearray(READ_BUFFER_BYTES)
        self.start = self.end = 0
        self.rest: list[memoryview] = []  # the reply's views still to fill
        self.skip = 0  # reply bytes to discard
        self.deadline = 0.0
        self.drained = False  # the socket had no more bytes in this turn

    # -- sending ---------------------------------------------------------------------

    def send(self, buffers: list[Any]) -> None:
        """Queue ``buffers`` (``bytes``, or flat byte memoryviews: ``len`` is their
        size) and send what the socket takes now."""
        self.out += buffers
        self.flush()

    def flush(self) -> None:
        """Send what the socket takes now."""
        out = self.out
        while out:
            try:
                sent = self.sock.sendmsg(out[:_IOV_MAX])
            except BlockingIOError:
                return
            done = 0
            while done < len(out) and sent >= len(out[done]):
                sent -= len(out[done])
                done += 1
            del out[:done]
            if sent:
                out[0] = memoryview(out[0])[sent:]

    # -- receiving -------------------------------------------------------------------

    def _recv(self, most: int = TAIL_BYTES) -> bool:
        """One ``recv`` of at most ``most`` bytes into the read buffer; False if the
        socket had nothing. A reply line is read ``TAIL_BYTES`` at a time: a larger
        read would bring a value's payload into the buffer, to be copied again."""
        if self.drained:
            return False
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            kept = self.end - self.start
            self.buf[:kept] = self.buf[self.start : self.end]
            self.start, self.end = 0, kept
        room = min(most, len(self.buf) - self.end)
        try:
            got = self.sock.recv_into(memoryview(self.buf)[self.end : self.end + room])
        except BlockingIOError:
            self.drained = True
            return False
        if not got:
            raise ConnectionError("the server closed the connection")
        self.drained = got < room
        self.end += got
        return True

    def line(self) -> bytes | None:
        """The next reply line without its CRLF, or None until more bytes come."""
        while True:
            i = self.buf.find(b"\r\n", self.start, self.end)
            if i >= 0:
                out = bytes(self.buf[self.start : i])
                self.start = i + 2
                return out
            if self.start == 0 and self.end == len(self.buf):
                raise ConnectionError("a reply line longer than the read buffer")
            if not self._recv():
                return None

    def fill(self) -> bool:
        """Fill ``rest`` from the stream; False until more bytes come. What is buffered
        is copied; the rest is read straight into the views, and up to ``TAIL_BYTES``
        past them into the (then empty) read buffer in the same call."""
        rest = self.rest
        while rest and self.end > self.start:
            n = min(len(rest[0]), self.end - self.start)
            rest[0][:n] = memoryview(self.buf)[self.start : self.start + n]
            self.start += n
            if n == len(rest[0]):
                rest.pop(0)
            else:
                rest[0] = rest[0][n:]
        if not rest:
            return True
        self.start = self.end = 0
        tail = memoryview(self.buf)[:TAIL_BYTES]
        while rest:
            if self.drained:
                return False
            want = sum(len(v) for v in rest) + TAIL_BYTES
            try:
                got = self.sock.recvmsg_into([*rest, tail])[0]
            except BlockingIOError:
                self.drained = True
                return False
            if not got:
                raise ConnectionError("the server closed the connection mid-reply")
            self.drained = got < want
            while rest and got >= len(rest[0]):
                got -= len(rest.pop(0))
            if rest:
                rest[0] = rest[0][got:]
            else:
                self.end = got  # what came after the views went into the read buffer
        return True

    def discard(self) -> bool:
        """Discard ``skip`` bytes of the stream; False until more bytes come."""
        while self.skip:
            if self.start == self.end and not self._recv(len(self.buf)):
                return False
            n = min(self.skip, self.end - self.start)
            self.start += n
            self.skip -= n
        return True

    def close(self) -> None:
        self.release()
