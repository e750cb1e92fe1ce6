"""How kvtier reaches Redis: ``RemoteOptions`` and the redis-py client they make.

Runs wherever a ``RemoteStore`` is opened; imports no torch. redis-py parses replies
with hiredis when it is installed (kvtier's dev environment has it). Clients never
retry on their own (``Retry(NoBackoff(), 0)``): after a failure the store's
``CircuitBreaker`` decides when the server is contacted again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from kvtier.errors import ConfigError
from kvtier.media.health import Backoff


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
    pool = redis.BlockingConnectionPool.from_url(o.url, timeout=o.timeout_s, **common)
    return redis.Redis(connection_pool=pool)
