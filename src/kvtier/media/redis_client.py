"""How kvtier reaches Redis: ``RemoteOptions`` and the redis-py client they make.

Runs wherever a ``RemoteStore`` is opened; imports no torch. redis-py parses replies
with hiredis when it is installed (kvtier's dev environment has it). Clients never
retry on their own (``Retry(NoBackoff(), 0)``): after a failure the store's
``CircuitBreaker`` decides when the server is contacted again.

Single-node connections also get ``ValuePacker`` as their command packer, so that a
block value (``BlockValue``: header + the CPU page itself) goes to the socket without
being copied: redis-py's own packers copy a large value two or three times (into one
``bytes``, then into one protocol buffer), which cost a third of the store bandwidth.
The store's own data path (``kvtier.media.remote_values``) skips redis-py's pipeline
altogether on a single node: it formats its ``SET`` itself, writes a whole batch with
``send_buffers`` (one ``sendmsg`` per batch where the kernel takes it all) and reads
the replies with ``ReplyReader``, on a connection ``Connections.owned`` keeps between
batches. redis-py's cluster client does not pass a packer through to its nodes, so on
a cluster the value is joined into one ``bytes`` first.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from kvtier.errors import ConfigError
from kvtier.media.circuit_breaker import Backoff
from kvtier.media.forks import renew_after_fork


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """How to reach the store (the ``remote_*`` configuration keys).

    Attributes:
        url: ``redis://host:port/db``, ``rediss://`` for TLS, or ``unix:///path``; a
            password in it is refused (use ``password_env``).
        cluster: a Redis Cluster (``url`` names any one node).
        timeout_s: socket connect and read timeout, seconds.
        password_env: name of the environment variable that holds the password
            (``None``: no password). Unset or empty: none is sent.
        ttl_s: expire each value this long after it is written (``None``: never).
        max_connections: connections per server (single node: waits for a free one).
        tls_ca_file: CA bundle to verify a ``rediss://`` server with (``None``: system).
        batch_bytes: largest pipeline, in value bytes; bigger batches are split.
        backoff: how long an unhealthy store is left alone.
    """

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False
    timeout_s: float = 1.0
    password_env: str | None = "KVTIER_REDIS_PASSWORD"
    ttl_s: float | None = None
    max_connections: int = 8
    tls_ca_file: str | None = None
    batch_bytes: int = 64 << 20
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                "remote_url", f"must be redis://, rediss:// or unix://, got {self.url!r}"
            )
        if parts.password:
            raise ConfigError(
                "remote_url",
                "holds a password; remove it and put it in the environment variable "
                f"named by remote_password_env ({self.password_env or 'KVTIER_REDIS_PASSWORD'})",
            )
        if self.cluster and parts.scheme == "unix":
            raise ConfigError("remote_cluster", "a Redis Cluster is reached over TCP, not unix://")
        for key, value in (("remote_timeout_s", self.timeout_s), ("remote_ttl_s", self.ttl_s)):
            if value is not None and not value > 0:
                raise ConfigError(key, f"must be a positive number of seconds, got {value!r}")
        if self.max_connections < 1 or self.batch_bytes < 1:
            raise ConfigError("remote_io_threads", "connections and batch bytes must be >= 1")


def make_client(o: RemoteOptions, password: str | None) -> Any:
    """A redis-py client for these options; a cluster client connects now."""
    common: dict[str, Any] = {
        "password": password,
        "socket_timeout": o.timeout_s,
        "socket_connect_timeout": o.timeout_s,
        "retry": Retry(NoBackoff(), 0),  # the breaker decides when to try again
        "max_connections": o.max_connections,
    }
    if o.tls_ca_file is not None:
        common["ssl_ca_certs"] = o.tls_ca_file
    if o.cluster:  # connects now, to learn the slots; a failure is a store failure
        return RedisCluster.from_url(o.url, **common)
    pool = redis.BlockingConnectionPool.from_url(
        o.url, timeout=o.timeout_s, command_packer=ValuePacker(), **common
    )
    return redis.Redis(connection_pool=pool)


class Connections:
    """A redis-py client, and on a single node the idle connections of kvtier's own
    batches (``owned``), kept out of redis-py's pool between batches.

    redis-py's ``BlockingConnectionPool.get_connection`` and ``release`` cost 14 us
    per batch on one thread (its queue, its metrics hooks, a ``can_read`` poll) and
    more with four threads contending for its lock; ``owned`` takes an idle
    connection off a stack under a plain lock and checks it with one ``poll`` of
    zero timeout. In a forked child (``os.fork``) every ``Connections`` starts afresh
    (``_after_fork``): a new lock, since another thread of the parent may have held
    the old one at the fork and would never release it in the child, and no idle
    connections, since their sockets are the parent's (left open for it, as redis-py
    leaves its pool's). At most ``max_connections - 1`` idle connections are kept, so
    the pool always has one left (or gets one back soon) for redis-py's own commands
    (``EXISTS``, ``DEL``, ``PING``), which take theirs from the pool.

    Attributes:
        client: the redis-py client (``redis.Redis`` or ``RedisCluster``).
    """

    def __init__(self, client: Any, max_connections: int) -> None:
        self.client = client
        self._pool: Any = getattr(client, "connection_pool", None)  # None on a cluster
        self._idle: list[Any] = []
        self._keep = max_connections - 1
        self._waiting = 0  # threads blocked in the pool for a connection
        self._lock = threading.Lock()
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, no idle connections, nobody waiting (the
        threads that held or waited on them are not in the child)."""
        self._lock = threading.Lock()
        self._idle, self._waiting = [], 0

    @contextlib.contextmanager
    def owned(self) -> Iterator[Any]:
        """A connected connection, ours until the block ends; disconnected if anything
        fails while we hold it (replies may be left unread: never reuse it)."""
        conn = self._take()
        try:
            yield conn
        except BaseException:
            conn.disconnect()
            self._pool.release(conn)
            raise
        with self._lock:
            # a thread blocked in the pool is woken only by a release to the pool
            if len(self._idle) < self._keep and not self._waiting:
                self._idle.append(conn)
                return
        self._pool.release(conn)

    def _take(self) -> Any:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is None:
                    self._waiting += 1  # under the lock: no connection is parked idle now
            if conn is None:
                try:
                    return self._pool.get_connection()
                finally:
                    with self._lock:
                        self._waiting -= 1
            if _ready(conn._sock):
                return conn
            conn.disconnect()  # closed by the server, or bytes nobody asked for
            self._pool.release(conn)

    def lend(self) -> Any:
        """A connected connection for as long as the caller wants it (``give_back``
        ends the loan); it is never kept idle here."""
        return self._take()

    def give_back(self, conn: Any) -> None:
        """End a ``lend``: the connection (disconnected first) goes back to the pool."""
        conn.disconnect()
        self._pool.release(conn)

    def close(self) -> None:
        """Close the client and every connection (a later ``owned`` reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        self.client.close()
        if self._pool is not None:
            for conn in idle:
                self._pool.release(conn)
            # A client over a pool it was given does not close that pool's sockets.
            self._pool.disconnect()


def _ready(sock: Any) -> bool:
    """Whether an idle connection's socket can carry a new command: open, nothing
    unread (a readable idle socket is at end of stream or out of step)."""
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


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
        """The value as one ``bytes`` (one copy), for clients without ``ValuePacker``."""
        return b"".join((self.header, self.payload))


class ValuePacker:
    """Packs commands into RESP for redis-py, sending large arguments as their own
    buffers (no copy) and a ``BlockValue`` as its header and its payload.

    Implements the ``pack(*args) -> list[buffer]`` protocol of redis-py's
    ``command_packer`` connection argument, for the commands kvtier sends.
    """

    CUTOFF = 6000
    """Arguments longer than this are sent as their own buffer (redis-py's cutoff)."""

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        if isinstance(args[0], str):  # e.g. "CLIENT SETINFO": one argument per word
            args = (*args[0].encode().split(), *args[1:])
        out: list[bytes | memoryview] = []
        head: list[bytes | memoryview] = [b"*%d\r\n" % len(args)]
        for arg in args:
            if isinstance(arg, BlockValue):
                head += [b"$%d\r\n" % arg.nbytes, arg.header]
                out += [b"".join(head), arg.payload]
                head = [b"\r\n"]
                continue
            data = _encode(arg)
            head.append(b"$%d\r\n" % len(data))
            if len(data) > self.CUTOFF:
                out += [b"".join(head), data]
                head = [b"\r\n"]
            else:
                head += [data, b"\r\n"]
        out.append(b"".join(head))
        return out


def _encode(arg: Any) -> bytes | memoryview:
    if isinstance(arg, (bytes, memoryview)):
        return arg
    if isinstance(arg, bytearray):
        return bytes(arg)
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return repr(arg).encode()
    raise TypeError(f"cannot send a {type(arg).__name__} to Redis")


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def send_buffers(sock: socket.socket, buffers: list[bytes | memoryview]) -> None:
    """Write every buffer to ``sock``, in order, none of them copied.

    One ``sendmsg`` takes as many buffers as the kernel allows (``IOV_MAX``) and
    sends what its socket buffer holds; a partial send resumes where it stopped.
    redis-py writes each buffer with its own ``sendall``: three system calls per
    value, each handing the GIL back and forth. A TLS socket has no ``sendmsg``; it
    gets one ``sendall`` per buffer.

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
    """Reads the replies to a pipeline of ``GET`` from a connection's socket, each value
    straight into the caller's buffers (no intermediate copy).

    redis-py's parsers (hiredis too) copy a large reply twice before Python sees it:
    into the parser's buffer, then into a new ``bytes``; this reader copies it once,
    from the kernel into the CPU page. It reads the socket of a connection its caller
    has taken from the pool (``connection._sock``: redis-py has no public accessor),
    so the caller must own that connection until every reply is read, and disconnect
    it if reading fails half-way. RESP2 and RESP3 replies to ``GET`` are understood.
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
            raise RedisConnectionError("the server closed the connection mid-reply")
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
                raise RedisConnectionError("a reply line longer than the read buffer")
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
        straight into its own page). On the development VM that made a 256 KiB load
        1.2-1.7 ``recv`` calls per value instead of 3. Empty views are skipped (reading
        into one would return 0, which reads as a closed connection).
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
                raise RedisConnectionError("the server closed the connection mid-reply")
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
