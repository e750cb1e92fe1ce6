"""``RemoteOptions``: how kvtier reaches its Redis, and the endpoint its URL names.

Pure Python; imports neither torch nor redis-py. A URL may carry credentials
(``redis://user:password@host``); nothing here lets them out: ``RemoteOptions``'s
``repr`` and every message name the server by ``redacted_url`` (scheme, host, port,
database), never its user or password.

URLs understood::

    redis://[user[:password]@]host[:port][/db]      TCP (port 6379, database 0 by default)
    rediss://[user[:password]@]host[:port][/db]     TCP with TLS
    unix://[user[:password]@]/path/to/socket[?db=N] a Unix socket
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from kvtier.errors import ConfigError
from kvtier.media.circuit_breaker import Backoff

if TYPE_CHECKING:
    from kvtier.config import OffloadingConfig

DEFAULT_PORT = 6379


def redacted_url(url: str) -> str:
    """``url`` without its user name and password, nor its query
    (``rediss://alice:pw@h:1/0`` -> ``rediss://h:1/0``)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one Redis listens and who kvtier is there, parsed from a URL.

    Attributes:
        tls: ``rediss://``.
        host: the TCP host (``None`` for a Unix socket).
        port: the TCP port.
        path: the Unix socket's path (``None`` over TCP).
        db: the database to ``SELECT``.
        username: the ACL user (``None``: the default user).
        password: the URL's password (``None``: none in the URL). Not in ``repr``.
    """

    tls: bool
    host: str | None
    port: int
    path: str | None
    db: int
    username: str | None
    password: str | None = field(repr=False)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """The endpoint of ``url``.

        Raises:
            ConfigError: (key ``remote_url``) not a URL of the forms above.
        """
        shown = redacted_url(url)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                "remote_url", f"must be redis://, rediss:// or unix://, got {shown!r}"
            )
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        try:
            port = parts.port
        except ValueError:
            raise ConfigError("remote_url", f"has no valid port: {shown!r}") from None
        query = parse_qs(parts.query)
        if set(query) - {"db"}:
            raise ConfigError("remote_url", f"only ?db=N is understood, got {shown!r}")
        if parts.scheme == "unix":
            if not parts.path:
                raise ConfigError("remote_url", f"names no socket path: {shown!r}")
            db_text = query.get("db", ["0"])[-1]
            return cls(False, None, 0, parts.path, _db(db_text, shown), username, password)
        if not parts.hostname:
            raise ConfigError("remote_url", f"names no host: {shown!r}")
        db_text = parts.path.strip("/") or query.get("db", ["0"])[-1]
        return cls(
            parts.scheme == "rediss",
            parts.hostname,
            port or DEFAULT_PORT,
            None,
            _db(db_text, shown),
            username,
            password,
        )

    @property
    def where(self) -> str:
        """The server, as messages name it (``host:port`` or ``unix:<path>``)."""
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"


def _db(text: str, shown: str) -> int:
    if not text.isdigit():
        raise ConfigError("remote_url", f"the database must be a number, got {shown!r}")
    return int(text)


@dataclass(frozen=True, slots=True, repr=False)
class RemoteOptions:
    """How to reach the store (the ``remote_*`` configuration keys).

    Attributes:
        url: ``redis://host:port/db``, ``rediss://`` for TLS, or ``unix:///path``; may
            name an ACL user and a password (``redis://user:password@host``).
        cluster: a Redis Cluster (``url`` names any one node).
        timeout_s: socket connect and read timeout, seconds.
        password_env: name of the environment variable that holds the password
            (``None``: none). Unset or empty: the URL's password, if any.
        ttl_s: expire each value this long after it is written (``None``: never).
        max_connections: connections per server (a caller waits for a free one).
        tls_ca_file: CA bundle to verify a ``rediss://`` server with (``None``: the
            system's).
        tls_cert_file: client certificate (PEM) for servers that ask for one
            (``None``: none); its key in it or in ``tls_key_file``.
        tls_key_file: the client certificate's private key (PEM), if not in
            ``tls_cert_file``.
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
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    batch_bytes: int = 64 << 20
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        endpoint = self.endpoint
        if self.cluster and endpoint.path is not None:
            raise ConfigError("remote_cluster", "a Redis Cluster is reached over TCP, not unix://")
        if self.cluster and endpoint.db:
            raise ConfigError("remote_url", "a Redis Cluster has database 0 only")
        for key, value in (("remote_timeout_s", self.timeout_s), ("remote_ttl_s", self.ttl_s)):
            if value is not None and not value > 0:
                raise ConfigError(key, f"must be a positive number of seconds, got {value!r}")
        if self.max_connections < 1 or self.batch_bytes < 1:
            raise ConfigError("remote_io_threads", "connections and batch bytes must be >= 1")
        tls_keys = ("tls_ca_file", "tls_cert_file", "tls_key_file")
        for name in tls_keys:
            if getattr(self, name) is not None and not endpoint.tls:
                raise ConfigError(f"remote_{name}", "is set but remote_url is not rediss://")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ConfigError("remote_tls_key_file", "is set without remote_tls_cert_file")

    @classmethod
    def from_config(cls, cfg: OffloadingConfig) -> RemoteOptions:
        """The options of a configuration's remote tier (its ``remote_*`` keys).

        ``max_connections``: each direction's ``remote_io_threads`` connections, one
        for the scheduler's existence checks and one for the store's own commands
        (its first contact, the deletes of corrupt values of a blocking batch).

        Raises:
            ConfigError: the configuration has no remote tier (``remote_url`` unset).
        """
        if cfg.remote_url is None:
            raise ConfigError("remote_url", "is not set: this configuration has no remote tier")
        return cls(
            url=cfg.remote_url,
            cluster=cfg.remote_cluster,
            timeout_s=cfg.remote_timeout_s,
            password_env=cfg.remote_password_env,
            ttl_s=cfg.remote_ttl_s,
            max_connections=2 * cfg.remote_io_threads + 2,
            tls_ca_file=cfg.remote_tls_ca_file,
            tls_cert_file=cfg.remote_tls_cert_file,
            tls_key_file=cfg.remote_tls_key_file,
            backoff=Backoff(base_s=cfg.remote_backoff_s),
        )

    @property
    def endpoint(self) -> Endpoint:
        """The server and user ``url`` names."""
        return Endpoint.parse(self.url)

    @property
    def shown_url(self) -> str:
        """``url`` without credentials, for messages and result files."""
        return redacted_url(self.url)

    def password(self, environ: Mapping[str, str]) -> str | None:
        """The password to send: ``password_env``'s value, else the URL's (``None``:
        send none).

        Raises:
            ConfigError: both hold one (keep one), or the URL names a user but no
                password is given.
        """
        from_env = environ.get(self.password_env) if self.password_env else None
        endpoint = self.endpoint
        if from_env and endpoint.password is not None:
            raise ConfigError(
                "remote_password_env",
                f"{self.password_env} is set and remote_url holds a password too; keep one",
            )
        password = from_env or endpoint.password
        if endpoint.username is not None and not password:
            raise ConfigError(
                "remote_password_env",
                f"remote_url names user {endpoint.username!r} but no password is given: "
                f"set {self.password_env or 'the variable remote_password_env names'}, "
                "or put it in the URL",
            )
        return password or None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={self.shown_url if name == 'url' else getattr(self, name)!r}"
            for name in self.__dataclass_fields__
        )
        return f"RemoteOptions({shown})"
