"""What a failed first contact with Redis means: a setting to change, or a server that
is down for now.

Runs where a ``RemoteStore`` is opened; imports no torch. ``RemoteStore.open`` contacts
the server once (connect, TLS, ``AUTH``, ``SELECT``, ``PING``). A refusal that no retry
can cure -- a wrong password or user, a server asking for a password none was given, a
certificate that does not verify either way, TLS spoken to a plain port, a database the
server does not have -- is a ``ConfigError`` naming the key to change, raised before
the engine serves anything. Anything else (refused, reset, timed out) is a server
that is down or hung now: the engine starts without it and the breaker retries.

Redis closes a TLS connection whose client certificate it refuses (or that sent none
while one is required) without an alert the client could read, right after the
client's side of the handshake completed (TLS 1.3): a TLS connection that ends before
the first reply (``ClosedAfterHandshake``) is taken for that. A ``rediss://`` URL
naming a plain Redis port cannot be told from a hung server (the server waits for a
line the TLS greeting never ends); the warning says what to try.

Messages name the server by host and port and the user by name; a password never
appears in them (nor does the server's reply, which never holds it).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping

from kvtier.errors import ConfigError
from kvtier.media.redis_client import AccessDenied, ClosedAfterHandshake
from kvtier.media.remote_options import RemoteOptions
from kvtier.media.resp import ErrorReply

_CLIENT_CERTIFICATE_REFUSED = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV1_ALERT_ACCESS_DENIED",
    "SSLV3_ALERT_HANDSHAKE_FAILURE",
}
"""TLS alerts a server sends when it refuses (or did not get) the client's certificate."""
_NOT_TLS = {"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"}
"""What the client's handshake sees when the server does not speak TLS on that port."""


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it was raised from (redis-py wraps socket and TLS errors)."""
    seen: set[int] = set()
    at: BaseException | None = error
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        yield at
        at = at.__cause__ or at.__context__


def _denied(error: BaseException) -> str | None:
    """The server's words if ``error`` is a refusal of the user or password."""
    if isinstance(error, AccessDenied):
        return str(error)
    try:
        from redis.exceptions import AuthenticationError, NoPermissionError
    except ImportError:  # pragma: no cover - redis-py is installed with the remote tier
        return None
    if isinstance(error, (AuthenticationError, NoPermissionError)):
        return str(error)
    return None


def config_problem(
    error: BaseException, options: RemoteOptions, password_key: str | None
) -> ConfigError | None:
    """The ``ConfigError`` that ``error`` (raised by a first contact) stands for, or
    ``None`` if it is not one (the server is down or hung: try again later).

    Args:
        error: what the first contact raised.
        options: the store's options.
        password_key: the key the password came from (``remote_password_env`` or
            ``remote_url``), ``None`` if none was sent.
    """
    endpoint = options.endpoint
    where = endpoint.where
    user = endpoint.username or "default"
    env = options.password_env or "the variable remote_password_env names"
    for e in _causes(error):
        words = _denied(e)
        if words is not None:
            if words.startswith("NOPERM"):
                return ConfigError(
                    "remote_url",
                    f"user {user!r} may not run kvtier's commands on the server at {where} "
                    f"({words}); grant it GET, SET, EXISTS, DEL and PING on keys kvtier:*",
                )
            if password_key is None:
                return ConfigError(
                    "remote_password_env",
                    f"the server at {where} requires a password ({words}); set {env}",
                )
            return ConfigError(
                password_key,
                f"the server at {where} refused user {user!r} with the password from "
                f"{env if password_key == 'remote_password_env' else 'remote_url'} "
                f"({words}); check the user and the password",
            )
        if isinstance(e, ssl.SSLCertVerificationError):
            ca = repr(options.tls_ca_file) if options.tls_ca_file else "the system's CA bundle"
            return ConfigError(
                "remote_tls_ca_file",
                f"the certificate of the server at {where} did not verify against {ca} "
                f"({e.verify_message}); set remote_tls_ca_file to the CA that signed it",
            )
        refused = isinstance(e, ssl.SSLError) and e.reason in _CLIENT_CERTIFICATE_REFUSED
        if refused or isinstance(e, ClosedAfterHandshake):
            why = e.reason if isinstance(e, ssl.SSLError) else "it closed the connection"
            if options.tls_cert_file is None:
                return ConfigError(
                    "remote_tls_cert_file",
                    f"the server at {where} asks for a client certificate ({why} after "
                    "the TLS handshake); set remote_tls_cert_file (and remote_tls_key_file)",
                )
            return ConfigError(
                "remote_tls_cert_file",
                f"the server at {where} refused the client certificate "
                f"{options.tls_cert_file!r} ({why} after the TLS handshake); use one "
                "signed by a CA the server trusts",
            )
        if isinstance(e, ssl.SSLError) and e.reason in _NOT_TLS:
            return ConfigError(
                "remote_url",
                f"the server at {where} does not speak TLS there ({e.reason}); "
                "use redis://, or the server's TLS port",
            )
        if isinstance(e, ErrorReply):
            return ConfigError(
                "remote_url", f"the server at {where} refused database {endpoint.db} ({e})"
            )
    return None


def password_key(options: RemoteOptions, environ: Mapping[str, str]) -> str | None:
    """The key the password sent comes from: ``remote_password_env`` (its variable is
    set), ``remote_url`` (the URL holds one), or ``None`` (none is sent)."""
    if options.password_env and environ.get(options.password_env):
        return "remote_password_env"
    return "remote_url" if options.endpoint.password else None


def hint(error: BaseException, options: RemoteOptions) -> str:
    """A word on what may be wrong when a first contact failed without a refusal."""
    if options.endpoint.tls:
        if isinstance(error, TimeoutError) and "handshake" in str(error):
            return "; if that port does not speak TLS, use redis://"
        return ""
    dropped = isinstance(error, ConnectionResetError) or (
        isinstance(error, ConnectionError) and "closed" in str(error)
    )
    return "; if that port speaks TLS, use rediss://" if dropped else ""
