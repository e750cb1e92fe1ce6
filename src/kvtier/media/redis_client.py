"""How kvtier connects to Redis: connections it owns (``RedisConnection``), a pool of
them (``Connections``), and redis-py's cluster client.

Runs wherever a ``RemoteStore`` is opened; imports no torch. A single node is reached
over sockets kvtier opens itself (TCP, TLS or Unix), authenticated (``AUTH [user]
password``) and with their database selected, then handed to the store's data path
(``remote_values``, ``remote_loop``), which writes and reads RESP on them directly:
nothing private of any client library is touched. A Redis Cluster needs slot routing
and redirections, so it goes through redis-py's public ``RedisCluster``, its values
joined into one ``bytes`` each.

Nothing retries on its own: after a failure the store's ``CircuitBreaker`` decides
when the server is contacted again.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvtier.errors import ConfigError
from kvtier.media.forks import renew_after_fork
from kvtier.media.remote_options import Endpoint, RemoteOptions
from kvtier.media.resp import ErrorReply, ReplyReader, command

__all__ = [
    "AccessDenied",
    "ClosedAfterHandshake",
    "Connections",
    "RedisConnection",
    "RemoteOptions",
]


class AccessDenied(Exception):
    """The server refused who kvtier says it is (``WRONGPASS``, ``NOAUTH``, ``NOPERM``).
    The message is the server's; it never holds the password."""


class ClosedAfterHandshake(ConnectionError):
    """A TLS connection ended after its handshake and before the server's first reply.

    With TLS 1.3 a client's handshake completes before the server has checked the
    client's certificate; Redis then closes a connection whose certificate it refuses,
    or that sent none while one is required, without a TLS alert the client could read.
    So this is what a refused client certificate looks like from the client."""


def tls_context(o: RemoteOptions) -> ssl.SSLContext | None:
    """The TLS context of a ``rediss://`` store (``None`` for ``redis://``, ``unix://``):
    the server's certificate verified against ``tls_ca_file`` (or the system's CAs) and
    its host name checked; the client certificate loaded when one is configured.

    Raises:
        ConfigError: a certificate, key or CA file is missing or unreadable.
    """
    if not o.endpoint.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=o.tls_ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("remote_tls_ca_file", f"cannot load {o.tls_ca_file!r}: {e}") from None
    if o.tls_cert_file is not None:
        try:
            context.load_cert_chain(o.tls_cert_file, o.tls_key_file)
        except (OSError, ssl.SSLError) as e:
            files = " and ".join(repr(f) for f in (o.tls_cert_file, o.tls_key_file) if f)
            raise ConfigError(
                "remote_tls_cert_file",
                f"cannot load the client certificate and key from {files}: {e}",
            ) from None
    return context


def readable(sock: Any) -> bool:
    """Whether an idle connection's socket has something to read now: the server
    closed it, it holds bytes nobody asked for, or it was closed here. Either way it
    must not carry a new command."""
    if sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class RedisConnection:
    """One connection to a single Redis, authenticated and its database selected.

    Blocking, with the store's timeout on every operation; ``sock`` is public: the
    data path writes and reads RESP on it (and the I/O loop makes it non-blocking).

    Attributes:
        sock: the socket (``ssl.SSLSocket`` over TLS).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._answered = False  # a reply came on this connection

    @classmethod
    def open(
        cls,
        endpoint: Endpoint,
        password: str | None,
        timeout_s: float,
        tls: ssl.SSLContext | None,
    ) -> RedisConnection:
        """Connect, shake hands (TLS), then ``AUTH`` and ``SELECT`` as needed.

        Raises:
            OSError: the server is unreachable, timed out, or closed the connection
                (``ssl.SSLError`` for a TLS handshake that failed).
            AccessDenied: the server refused the user or password.
            ErrorReply: it refused the database.
        """
        if endpoint.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(endpoint.path)
            except BaseException:
                sock.close()
                raise
        else:
            assert endpoint.host is not None
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if tls is not None:
                    sock = tls.wrap_socket(sock, server_hostname=endpoint.host)
            except BaseException:
                sock.close()
                raise
        conn = cls(sock)
        try:
            conn._introduce(endpoint, password)
        except BaseException:
            conn.close()
            raise
        return conn

    def _introduce(self, endpoint: Endpoint, password: str | None) -> None:
        commands = []
        if password is not None:
            user = [endpoint.username] if endpoint.username else []
            commands.append(command(b"AUTH", *user, password))
        if endpoint.db:
            commands.append(command(b"SELECT", endpoint.db))
        replies = self.call(commands)
        if password is not None and isinstance(replies[0], ErrorReply):
            raise AccessDenied(str(replies[0]))
        for reply in replies:
            if isinstance(reply, ErrorReply):
                raise reply

    def call(self, commands: Sequence[bytes]) -> list[bytes | int | ErrorReply | None]:
        """Send ``commands`` (RESP, see ``resp.command``) at once; their replies, in
        order (an error reply as an ``ErrorReply`` value)."""
        if not commands:
            return []
        try:
            self.sock.sendall(b"".join(commands))
            reader = ReplyReader(self.sock, 4096)
            replies = [reader.reply() for _ in commands]
        except (ConnectionError, ssl.SSLEOFError) as e:
            if self._answered or not isinstance(self.sock, ssl.SSLSocket):
                raise
            raise ClosedAfterHandshake(
                f"the TLS connection ended before any reply ({type(e).__name__}: {e})"
            ) from e
        self._answered = True
        return replies

    def ping(self) -> None:
        """``PING``; returns once the server answered ``PONG``.

        Raises:
            AccessDenied: the server wants a password (``NOAUTH``), or this user may
                not run commands (``NOPERM``).
            ConnectionError: any other answer.
        """
        (reply,) = self.call([command(b"PING")])
        if isinstance(reply, ErrorReply):
            if str(reply).startswith(("NOAUTH", "NOPERM", "WRONGPASS")):
                raise AccessDenied(str(reply))
            raise ConnectionError(f"PING answered {str(reply)[:80]!r}")
        if reply != b"PONG":
            raise ConnectionError(f"PING answered {reply!r:.80}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Connections:
    """The connections of one store to a single node: at most ``max_connections`` open
    (idle or in use), the idle ones kept for the next batch.

    A batch takes an idle connection off a stack under a plain lock and checks it with
    one ``poll`` of zero timeout (``readable``): one the server closed while idle is
    replaced, not used. A caller finding every connection in use waits for one to be
    released, at most ``timeout_s``. In a forked child (``os.fork``) every
    ``Connections`` starts afresh (``_after_fork``): a new lock, since another thread
    of the parent may have held the old one at the fork and would never release it in
    the child, and no connections, since their sockets are the parent's (the child's
    copies are closed; the parent's stay open).

    Args:
        open_one: makes one connection (``RedisConnection.open`` for this store).
        max_connections: connections open at most.
        timeout_s: longest wait for a free connection.
    """

    def __init__(
        self, open_one: Callable[[], RedisConnection], max_connections: int, timeout_s: float
    ) -> None:
        self._open_one = open_one
        self._max = max_connections
        self._timeout_s = timeout_s
        self._start_fresh()
        renew_after_fork(self)

    def _start_fresh(self) -> None:
        self._lock = threading.Condition()
        self._idle: list[RedisConnection] = []
        self._open = 0  # connections made and not closed: idle or in use
        self._closed = False  # closed: connections coming back are closed, not kept

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, no connections (the threads that held or
        waited on them are not in the child)."""
        for conn in self._idle:
            conn.close()  # the child's copy of the descriptor; the parent's stays open
        self._start_fresh()

    @contextlib.contextmanager
    def owned(self) -> Iterator[RedisConnection]:
        """A connection, ours until the block ends; closed if anything fails while we
        hold it (replies may be left unread: never reuse it)."""
        conn = self._take()
        try:
            yield conn
        except BaseException:
            self._drop(conn)
            raise
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                self._lock.notify()
                return
        self._drop(conn)

    def call(self, commands: Sequence[bytes]) -> list[bytes | int | ErrorReply | None]:
        """``commands`` pipelined on one connection; their replies (``RedisConnection.call``)."""
        with self.owned() as conn:
            return conn.call(commands)

    def lend(self) -> RedisConnection:
        """A connection for as long as the caller wants it (``give_back`` ends the
        loan); it is closed when given back, never kept idle."""
        return self._take()

    def give_back(self, conn: RedisConnection) -> None:
        """End a ``lend``: the connection is closed and its place freed."""
        self._drop(conn)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when they come back
        (a caller still holding this pool gets fresh connections, never kept)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._closed = True
            self._lock.notify_all()
        for conn in idle:
            conn.close()

    def _take(self) -> RedisConnection:
        deadline: float | None = None
        with self._lock:
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if not readable(conn.sock):
                        return conn
                    conn.close()  # closed by the server, or bytes nobody asked for
                    self._open -= 1
                if self._open < self._max:
                    self._open += 1
                    break
                now = time.monotonic()
                deadline = now + self._timeout_s if deadline is None else deadline
                if now >= deadline:
                    raise TimeoutError(
                        f"no free connection in {self._timeout_s} s ({self._max} in use)"
                    )
                self._lock.wait(deadline - now)
        try:
            return self._open_one()
        except BaseException:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            raise

    def _drop(self, conn: RedisConnection) -> None:
        conn.close()
        with self._lock:
            self._open -= 1
            self._lock.notify()


def cluster_client(o: RemoteOptions, password: str | None) -> Any:
    """redis-py's ``RedisCluster`` for these options; it connects now, to learn the
    slots (a failure is a store failure).

    Raises:
        redis.RedisError, redis.exceptions.RedisClusterException: as redis-py does.
    """
    from redis.backoff import NoBackoff
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    kwargs: dict[str, Any] = {
        "password": password,
        "socket_timeout": o.timeout_s,
        "socket_connect_timeout": o.timeout_s,
        "retry": Retry(NoBackoff(), 0),  # the breaker decides when to try again
        "max_connections": o.max_connections,
    }
    if o.endpoint.tls:
        kwargs["ssl_ca_certs"] = o.tls_ca_file
        kwargs["ssl_certfile"] = o.tls_cert_file
        kwargs["ssl_keyfile"] = o.tls_key_file
    return RedisCluster.from_url(o.url, **kwargs)
