"""The remote medium: verified block values in Redis or Valkey, single node or cluster.

Runs on the worker side (handlers call it from their I/O threads) and, for
``exists_many``, wherever the scheduler asks whether a shared store holds a block;
thread-safe, and usable in a child forked while other threads used it (its locks, its
breaker's and its connections' start afresh there); imports no torch. One block is
one value, ``header || payload`` in the verified format of ``block_format``, under the
key::

    kvtier:v1:<model fingerprint digest, hex>:<block key, hex>

so two models, dtypes or layouts (different fingerprints) never share a value, and
tenants do not either (the cache salt is inside the block key). ``v1`` names this
layout of keys; the value's own header says its format (plaintext, or sealed with an
``encryption_key_file``: ``block_codec``), and a store reads only its own.

Every batch (``write_many``, ``read_many_into``, ``exists_many``, ``delete_many``) is
one pipeline per ``batch_bytes`` of values (per node, on a cluster) on one connection;
a single node's loads keep only a window of ``GET`` outstanding on it
(``remote_values.get_window``).
Any error or timeout fails the batch with ``TransferError`` and marks the store
unhealthy in its ``CircuitBreaker``: it is not contacted again until the backoff
expires, and meanwhile every call fails at once. A value that fails verification is
a miss: it is deleted and never served. The store decides no eviction: the server's
``maxmemory`` with ``allkeys-lru`` does (see ``docs/remote.md``).

``open`` contacts the server once, within ``timeout_s``: settings the server refuses
(password, user, certificates, TLS, database) raise ``ConfigError`` there, before the
engine serves; a server that is down or hung is logged, counted as an outage in the
breaker, and the engine starts without it (``remote_access``). The connection of that
contact is kept for the first batch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvtier.errors import TransferError
from kvtier.key_file import EncryptionKey
from kvtier.media import block_format
from kvtier.media.block_codec import BlockCodec, codec_for
from kvtier.media.block_format import BytesLike
from kvtier.media.circuit_breaker import CircuitBreaker, Health
from kvtier.media.forks import renew_after_fork
from kvtier.media.redis_client import (
    AccessDenied,
    Connections,
    RedisConnection,
    cluster_client,
    tls_context,
)
from kvtier.media.remote_access import config_problem, hint, password_key
from kvtier.media.remote_options import RemoteOptions
from kvtier.media.remote_values import ReadOutcome, accept, get_into_pages, set_from_pages
from kvtier.media.resp import BlockValue, ErrorReply, command

__all__ = ["LAYOUT_VERSION", "ReadOutcome", "RemoteOptions", "RemoteStore"]

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 1
"""Version of the key layout and value format; the ``v1`` in every key."""
_STORE_ERRORS = (RedisError, RedisClusterException, OSError, AccessDenied, ErrorReply)
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)
T = TypeVar("T")
_CLUSTER_METHODS = {b"GET": "get", b"EXISTS": "exists", b"DEL": "delete"}
"""redis-py's cluster pipeline method of each command the store pipelines."""


def _as_array(buf: np.ndarray | BytesLike) -> np.ndarray:
    """A flat ``uint8`` view of a C-contiguous buffer (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


class RemoteStore:
    """A block store over one Redis (or cluster). Build it with ``RemoteStore.open``.

    Attributes:
        fingerprint: the model fingerprint digest every key and value is bound to.
        codec: how values are written and read (sealed with a key, or plaintext).
        options: how the store is reached.
        breaker: its health (shared by every thread using the store).
    """

    def __init__(
        self,
        codec: BlockCodec,
        options: RemoteOptions,
        password: str | None,
        breaker: CircuitBreaker,
    ) -> None:
        fingerprint = codec.fingerprint
        self.fingerprint = fingerprint
        self.codec = codec
        self.options = options
        self.breaker = breaker
        self._prefix = f"kvtier:v{LAYOUT_VERSION}:{fingerprint.hex()}:".encode()
        self._password = password
        self._endpoint = options.endpoint
        self._tls = tls_context(options)
        self._link: Connections | None = None  # a single node's, made on first use
        self._cluster: Any = None  # redis-py's cluster client, made on first use
        self._lock = threading.Lock()
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent thread may have held the old one
        at the fork; it never releases it in the child). ``Connections`` and
        ``CircuitBreaker`` start afresh on their own."""
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        fingerprint: bytes,
        options: RemoteOptions,
        *,
        breaker: CircuitBreaker | None = None,
        environ: Mapping[str, str] = os.environ,
        keys: Sequence[EncryptionKey] = (),
    ) -> RemoteStore:
        """A store for one model, after one contact with the server (within
        ``options.timeout_s``; see the module docstring).

        Args:
            fingerprint: the model fingerprint digest (1..255 bytes).
            options: URL, cluster flag, timeouts, TTL, TLS files (see ``RemoteOptions``).
            breaker: the health tracker (a new one from ``options.backoff`` if None).
            environ: where the password variable is looked up.
            keys: the keys of ``encryption_key_file`` (the first seals every value,
                each opens its own); none: values are plaintext (verified).

        Raises:
            ConfigError: a setting the server refuses (password, user, certificate,
                TLS, database), or a TLS file that cannot be loaded; the message names
                the key to change and never holds the password.
        """
        if not 1 <= len(fingerprint) <= block_format.MAX_NAME_BYTES:
            raise ValueError(f"fingerprint digest must be 1..255 bytes, got {len(fingerprint)}")
        password = options.password(environ)
        codec = codec_for(fingerprint, keys)
        store = cls(codec, options, password, breaker or CircuitBreaker(options.backoff))
        store._first_contact(password_key(options, environ))
        return store

    def _first_contact(self, password_from: str | None) -> None:
        """Connect, authenticate and ``PING`` once; what a failure means is decided by
        ``remote_access.config_problem``. ``password_from``: the key the password came
        from (``None``: none is sent)."""
        if not self.breaker.allow():
            return
        try:
            self._ping_once()
        except _STORE_ERRORS as e:
            problem = config_problem(e, self.options, password_from)
            if problem is not None:
                self.breaker.record_success()  # it answered; the store is never used
                self.close()
                raise problem from None
            why = f"{type(e).__name__}: {e}"
            self.breaker.record_failure(why)
            logger.warning(
                "remote store at %s did not answer at start (%s%s); starting without it, "
                "next try in %.1f s",
                self._endpoint.where,
                why,
                hint(e, self.options),
                self.breaker.retry_in(),
            )
            return
        self.breaker.record_success()

    # -- health ----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False while the store is backing off after a failure (calls fail fast)."""
        return self.breaker.state is Health.HEALTHY

    @property
    def outages(self) -> int:
        """Outages of the store so far (see ``CircuitBreaker.outages``)."""
        return self.breaker.outages

    def ping(self) -> bool:
        """Contact the server now, if the breaker allows; whether it answered."""
        try:
            self._run(self._ping_once)
        except TransferError:
            return False
        return True

    def _ping_once(self) -> None:
        if self.options.cluster:
            self._cluster_client().ping()
            return
        with self._connections().owned() as conn:
            conn.ping()

    def close(self) -> None:
        """Drop the connections; a later call reconnects."""
        with self._lock:
            link, self._link = self._link, None
            cluster, self._cluster = self._cluster, None
        if link is not None:
            link.close()
        if cluster is not None:
            cluster.close()
            # redis-py's close leaves the nodes' pools connected (each node's client
            # does not own its pool): their sockets would stay open until collected.
            for node in cluster.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()

    # -- keys ------------------------------------------------------------------------

    def redis_key(self, key: bytes) -> bytes:
        """The Redis key of block ``key`` (``kvtier:v1:<fingerprint hex>:<key hex>``)."""
        if not 1 <= len(key) <= block_format.MAX_NAME_BYTES:
            raise TransferError(f"a block key is 1..255 bytes, got {len(key)}")
        return self._prefix + key.hex().encode()

    def value(self, key: bytes, page: np.ndarray) -> BlockValue:
        """The value stored for ``page`` (a flat ``uint8`` array) under block ``key``:
        its header and the page itself, or (sealed) its ciphertext in a new buffer;
        nothing joined."""
        header, body = self.codec.seal(key, page)
        return BlockValue(header, body.data.cast("B"))

    def header_size(self, key_length: int) -> int:
        """Bytes of the header this store writes for a key of ``key_length`` bytes."""
        return self.codec.header_size(key_length)

    # -- connections for an event loop (``remote_loop``) -----------------------------

    @property
    def multiplexable(self) -> bool:
        """Whether ``lend_connection`` gives plain sockets (a single node over TCP or a
        Unix socket: not a cluster, not TLS)."""
        return not self.options.cluster and self._tls is None

    def lend_connection(self) -> tuple[RedisConnection, Callable[[], None]]:
        """A connection of the store (authenticated, its database selected), the
        caller's until it calls the function returned with it, which closes it and
        frees its place. The caller may make its socket non-blocking. Needs
        ``multiplexable``.

        Raises:
            TransferError: no connection could be made (the breaker records it).
        """
        assert self.multiplexable
        try:
            link = self._connections()
            conn = link.lend()
        except _STORE_ERRORS as e:
            self.breaker.record_failure(repr(e))
            raise TransferError(f"remote store failed: {type(e).__name__}: {e}") from e
        return conn, partial(link.give_back, conn)

    # -- batches ---------------------------------------------------------------------

    def write_many(self, keys: Sequence[bytes], payloads: Sequence[np.ndarray | BytesLike]) -> None:
        """Store each payload as its block, replacing any value of that key.

        Raises:
            TransferError: the store is unhealthy, failed or timed out (it is then
                marked unhealthy), or refused a value (e.g. out of memory under
                ``noeviction``). Values of the batch may be stored or not.
        """
        if len(keys) != len(payloads):
            raise ValueError(f"{len(keys)} keys for {len(payloads)} payloads")
        names = [self.redis_key(k) for k in keys]
        arrays = [_as_array(p) for p in payloads]
        px = None if self.options.ttl_s is None else max(1, round(self.options.ttl_s * 1000))
        for chunk in self._chunks([a.nbytes for a in arrays]):
            batch = [(names[i], self.value(keys[i], arrays[i])) for i in chunk]
            if self.options.cluster:

                def queue(pipe: Any, batch: list[Any] = batch) -> None:
                    for name, value in batch:
                        pipe.set(name, value.joined(), px=px)

                results: list[Any] = self._execute(queue)
            else:
                results = self._run(
                    partial(set_from_pages, self._connections(), batch=batch, px=px)
                )
            refused = [r for r in results if isinstance(r, Exception)]
            if refused:
                raise TransferError(f"{len(refused)} of {len(chunk)} values refused: {refused[0]}")

    def read_many_into(
        self, keys: Sequence[bytes], outs: Sequence[np.ndarray | bytearray | memoryview]
    ) -> list[ReadOutcome]:
        """Load each block into its buffer (exactly its payload length) and verify it.

        A buffer whose block is missed, corrupt or undecryptable is zero-filled; a
        corrupt or undecryptable value is deleted. On a raised error every buffer is
        zero-filled.

        Raises:
            TransferError: the store is unhealthy, failed or timed out.
        """
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys for {len(outs)} buffers")
        dests = [_as_array(o) for o in outs]
        names = [self.redis_key(k) for k in keys]
        outcomes: list[ReadOutcome] = []
        try:
            for chunk in self._chunks([d.nbytes for d in dests]):
                batch = [(keys[i], names[i], dests[i]) for i in chunk]
                if self.options.cluster:
                    values = self._pipelined(b"GET", [name for _, name, _ in batch])
                    for (k, _, dest), value in zip(batch, values, strict=True):
                        outcomes.append(accept(self.codec, k, value, dest))
                else:
                    got = self._run(
                        partial(get_into_pages, self._connections(), codec=self.codec, batch=batch)
                    )
                    outcomes += got
        except TransferError:
            for d in dests:
                d[:] = 0
            raise
        corrupt = [names[i] for i, o in enumerate(outcomes) if o.rejected]
        if corrupt:
            try:
                self._pipelined(b"DEL", corrupt)
            except TransferError as e:
                logger.warning("could not delete %d corrupt remote values: %s", len(corrupt), e)
        return outcomes

    def exists_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each block is stored now (by any engine sharing the store).

        One round trip (per node); reads no values. For ``lookup`` of a shared tier:
        an existing value can still be evicted before it is read, or fail
        verification, so a load after a ``True`` may still miss.

        Raises:
            TransferError: the store is unhealthy, failed or timed out.
        """
        if not keys:
            return []
        return [r == 1 for r in self._pipelined(b"EXISTS", [self.redis_key(k) for k in keys])]

    def delete_many(self, keys: Sequence[bytes]) -> int:
        """Remove these blocks; how many were stored.

        Raises:
            TransferError: the store is unhealthy, failed or timed out.
        """
        if not keys:
            return 0
        return sum(r == 1 for r in self._pipelined(b"DEL", [self.redis_key(k) for k in keys]))

    # -- internals -------------------------------------------------------------------

    def _chunks(self, sizes: Sequence[int]) -> Iterator[range]:
        """Consecutive index ranges of at most ``batch_bytes`` (at least one item each)."""
        start, total = 0, 0
        for i, n in enumerate(sizes):
            if i > start and total + n > self.options.batch_bytes:
                yield range(start, i)
                start, total = i, 0
            total += n
        if start < len(sizes):
            yield range(start, len(sizes))

    def _pipelined(self, verb: bytes, names: list[bytes]) -> list[Any]:
        """One single-key command per name, pipelined; replies in order (an error
        reply as a value)."""
        if not self.options.cluster:
            commands = [command(verb, name) for name in names]
            return self._run(partial(self._connections().call, commands))

        def queue(pipe: Any) -> None:
            method = getattr(pipe, _CLUSTER_METHODS[verb])
            for name in names:
                method(name)

        return self._execute(queue)

    def _execute(self, queue: Callable[[Any], None]) -> list[Any]:
        """Run one cluster pipeline that ``queue`` fills; per-command errors come back
        as values. A connection lost inside it (a node that failed) fails the batch."""

        def send() -> list[Any]:
            pipe = self._cluster_client().pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute(raise_on_error=False))

        results = self._run(send)
        lost = next((r for r in results if isinstance(r, _LOST)), None)
        if lost is not None:
            self.breaker.record_failure(repr(lost))
            raise TransferError(f"remote store failed: {lost!r}")
        return results

    def _run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` if the breaker allows; record the outcome in it."""
        if not self.breaker.allow():
            b = self.breaker
            raise TransferError(
                f"remote store unhealthy after {b.failures} failure(s) ({b.last_error}); "
                f"next try in {b.retry_in():.1f} s"
            )
        try:
            result = fn()
        except _STORE_ERRORS as e:
            self.breaker.record_failure(repr(e))
            raise TransferError(f"remote store failed: {type(e).__name__}: {e}") from e
        except BaseException as e:  # a bug; the probe must not stay in flight forever
            self.breaker.record_failure(repr(e))
            raise
        self.breaker.record_success()
        return result

    def _connections(self) -> Connections:
        """A single node's connections (made once)."""
        with self._lock:
            if self._link is None:
                opener = partial(
                    RedisConnection.open,
                    self._endpoint,
                    self._password,
                    self.options.timeout_s,
                    self._tls,
                )
                self._link = Connections(
                    opener, self.options.max_connections, self.options.timeout_s
                )
            return self._link

    def _cluster_client(self) -> Any:
        """redis-py's cluster client (made once; making it connects)."""
        with self._lock:
            if self._cluster is None:
                self._cluster = cluster_client(self.options, self._password)
            return self._cluster
