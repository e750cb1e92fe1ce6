"""The remote store over TLS and as a Redis ACL user, against real ``redis-server``
processes: one listening on TLS only with client certificates required (certificates
made by the test with ``openssl``), one taking its users from an ACL file.

Whatever the server refuses -- no client certificate, one another CA signed, a server
certificate the CA file does not verify, TLS to a plain port, a wrong password or
user, none at all -- is one ``ConfigError`` from ``RemoteStore.open`` naming the key
to change; and no password ever shows in a log line, an error, a repr or a breaker's
last error, whether its connection failed or worked.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.errors import ConfigError, TransferError
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore
from kvtier.media.remote_loop import Op, RemoteLoop

from ..certificates import Certificates, make_certificates
from ..redis_server import RedisServer, require_redis

FP = b"\x3c" * 32
BLOCK = 8192
ALICE = "alice-pw-5f0b7c"  # kvtier's user: every command on kvtier's keys
BOB = "bob-pw-9e41d2"  # a user whose keys are others': kvtier's writes are refused
ACL = f"""\
user default off
user alice on >{ALICE} ~kvtier:* +@all
user bob on >{BOB} ~other:* +@all
"""


def key(i: int) -> bytes:
    return bytes([i]) * 32


def payload(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    require_redis()
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_server(tmp_path: Path, certs: Certificates) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "tls", tls=certs).start()
    yield s
    s.stop()


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[RedisServer]:
    acl = tmp_path / "users.acl"
    acl.write_text(ACL)
    s = RedisServer(tmp_path / "acl", ["--aclfile", str(acl)], username="alice", password=ALICE)
    yield s.start()
    s.stop()


def tls_options(server: RedisServer, certs: Certificates, **kw: Any) -> RemoteOptions:
    files = {
        "tls_ca_file": str(certs.ca),
        "tls_cert_file": str(certs.client_cert),
        "tls_key_file": str(certs.client_key),
    }
    return RemoteOptions(url=server.url, timeout_s=5.0, **(files | kw))


def acl_url(server: RedisServer, userinfo: str) -> str:
    return f"redis://{userinfo}@127.0.0.1:{server.port}/0"


def round_trip(store: RemoteStore) -> None:
    keys = [key(i) for i in range(3)]
    store.write_many(keys, [payload(i) for i in range(3)])
    outs = np.zeros((3, BLOCK), np.uint8)
    assert store.read_many_into(keys, list(outs)) == [ReadOutcome.HIT] * 3
    assert all(np.array_equal(outs[i], payload(i)) for i in range(3))
    assert store.exists_many([key(0), key(9)]) == [True, False]


# -- TLS --------------------------------------------------------------------------------


def test_tls_with_a_client_certificate_round_trips_through_store_and_loop(
    tls_server: RedisServer, certs: Certificates
) -> None:
    """The server listens on TLS only and requires a client certificate: the store's
    batches and the I/O loop's (served by blocking calls over TLS) both go through."""
    store = RemoteStore.open(FP, tls_options(tls_server, certs), environ={})
    loop = RemoteLoop(store, connections=2, name="test-tls-loop")
    try:
        assert store.healthy and not store.multiplexable
        round_trip(store)
        done: list[Any] = []
        loop.submit(Op.STORE, [key(5)], [payload(5)], done.append)
        out = np.zeros(BLOCK, np.uint8)
        loop.submit(Op.LOAD, [key(5)], [out], done.append)
        loop.close()
        assert [r.error for r in done] == [None, None] and np.array_equal(out, payload(5))
        with tls_server.client() as client:
            assert client.exists(store.redis_key(key(5))) == 1
    finally:
        loop.close()
        store.close()


def test_a_certificate_and_key_in_one_file_are_enough(
    tls_server: RedisServer, certs: Certificates, tmp_path: Path
) -> None:
    both = tmp_path / "client-with-key.pem"
    both.write_bytes(certs.client_cert.read_bytes() + certs.client_key.read_bytes())
    options = tls_options(tls_server, certs, tls_cert_file=str(both), tls_key_file=None)
    store = RemoteStore.open(FP, options, environ={})
    try:
        round_trip(store)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("change", "config_key", "words"),
    [
        ({"tls_cert_file": None, "tls_key_file": None}, "remote_tls_cert_file", "asks for"),
        ({"stranger": True}, "remote_tls_cert_file", "refused the client certificate"),
        ({"wrong_ca": True}, "remote_tls_ca_file", "did not verify"),
        ({"tls_ca_file": None}, "remote_tls_ca_file", "the system's CA bundle"),
        ({"tls_cert_file": "/nonexistent/client.pem"}, "remote_tls_cert_file", "cannot load"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "remote_tls_ca_file", "cannot load"),
    ],
)
def test_a_certificate_the_handshake_refuses_is_one_config_error_at_open(
    tls_server: RedisServer,
    certs: Certificates,
    change: dict[str, Any],
    config_key: str,
    words: str,
) -> None:
    kw = {k: v for k, v in change.items() if k not in ("stranger", "wrong_ca")}
    if change.get("stranger"):
        kw |= {"tls_cert_file": str(certs.stranger_cert), "tls_key_file": str(certs.stranger_key)}
    if change.get("wrong_ca"):
        kw["tls_ca_file"] = str(certs.other_ca)
    with pytest.raises(ConfigError, match=words) as error:
        RemoteStore.open(FP, tls_options(tls_server, certs, **kw), environ={})
    assert error.value.key == config_key
    assert f"127.0.0.1:{tls_server.port}" in str(error.value) or "cannot load" in words


def test_tls_to_a_server_that_answers_in_plain_is_one_config_error_at_open() -> None:
    """A server that greets in plain RESP (an error line) where the TLS handshake
    expects a server hello: the URL is wrong, and said so."""
    listener = socket.create_server(("127.0.0.1", 0))

    def greet() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"-ERR unknown command\r\n")
                conn.recv(4096)

    t = threading.Thread(target=greet, daemon=True)
    t.start()
    url = f"rediss://127.0.0.1:{listener.getsockname()[1]}/0"
    try:
        with pytest.raises(ConfigError, match="does not speak TLS") as error:
            RemoteStore.open(FP, RemoteOptions(url=url, timeout_s=5.0), environ={})
        assert error.value.key == "remote_url"
    finally:
        listener.close()
        t.join(10)


def test_tls_to_a_plain_redis_port_says_so_and_starts_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """rediss:// to a plain Redis: the server waits for a line the TLS greeting never
    ends, as a hung server would; the engine starts without the store and the warning
    says what to try."""
    plain = RedisServer(tmp_path / "plain").start()
    try:
        url = f"rediss://127.0.0.1:{plain.port}/0"
        store = RemoteStore.open(FP, RemoteOptions(url=url, timeout_s=0.5), environ={})
        assert not store.healthy
        (warning,) = [r.getMessage() for r in caplog.records if r.name == "kvtier.media.remote"]
        assert "did not answer at start" in warning and "use redis://" in warning
        store.close()
    finally:
        plain.stop()


def test_plain_redis_to_a_tls_port_says_so_and_starts_without_it(
    tls_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """redis:// to a TLS-only port: the server drops the connection; the engine starts
    without the store (as for a server that is down) and the warning says what to try."""
    url = f"redis://127.0.0.1:{tls_server.port}/0"
    store = RemoteStore.open(FP, RemoteOptions(url=url, timeout_s=5.0), environ={})
    try:
        assert not store.healthy
        (warning,) = [r.getMessage() for r in caplog.records if r.name == "kvtier.media.remote"]
        assert "did not answer at start" in warning and "use rediss://" in warning
    finally:
        store.close()


# -- ACL users --------------------------------------------------------------------------


def test_an_acl_user_with_the_password_in_the_url_round_trips(acl_server: RedisServer) -> None:
    store = RemoteStore.open(
        FP, RemoteOptions(url=acl_url(acl_server, f"alice:{ALICE}")), environ={}
    )
    try:
        round_trip(store)
        assert repr(store.options).count(ALICE) == 0
    finally:
        store.close()


def test_an_acl_user_in_the_url_with_the_password_from_the_environment(
    acl_server: RedisServer,
) -> None:
    options = RemoteOptions(url=acl_url(acl_server, "alice"), password_env="KVTIER_TEST_PW")
    store = RemoteStore.open(FP, options, environ={"KVTIER_TEST_PW": ALICE})
    try:
        round_trip(store)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("userinfo", "environ", "config_key", "words"),
    [
        (
            "alice",
            {"KVTIER_TEST_PW": "not-" + ALICE},
            "remote_password_env",
            "refused user 'alice'",
        ),
        (f"alice:not-{ALICE}", {}, "remote_url", "refused user 'alice'"),
        (f"mallory:{ALICE}", {}, "remote_url", "refused user 'mallory'"),
        (None, {}, "remote_password_env", r"requires a password \(NOAUTH.*set KVTIER_TEST_PW"),
        ("alice", {}, "remote_password_env", "names user 'alice' but no password"),
        (f"alice:{ALICE}", {"KVTIER_TEST_PW": ALICE}, "remote_password_env", "keep one"),
    ],
)
def test_credentials_the_server_refuses_are_one_config_error_at_open(
    acl_server: RedisServer,
    userinfo: str | None,
    environ: dict[str, str],
    config_key: str,
    words: str,
) -> None:
    url = acl_server.url if userinfo is None else acl_url(acl_server, userinfo)
    options = RemoteOptions(url=url, password_env="KVTIER_TEST_PW")
    with pytest.raises(ConfigError, match=words) as error:
        RemoteStore.open(FP, options, environ=environ)
    assert error.value.key == config_key
    assert ALICE not in str(error.value)


def test_a_user_without_rights_on_kvtier_keys_fails_its_writes_not_the_store(
    acl_server: RedisServer,
) -> None:
    """``bob`` may run commands, on others' keys only: each batch is refused by the
    server (``NOPERM``), said so in its error; the store is not counted down."""
    store = RemoteStore.open(FP, RemoteOptions(url=acl_url(acl_server, f"bob:{BOB}")), environ={})
    try:
        with pytest.raises(TransferError, match="refused: NOPERM"):
            store.write_many([key(1)], [payload(1)])
        assert store.healthy
    finally:
        store.close()


# -- credentials never shown ------------------------------------------------------------


def test_no_password_appears_in_logs_errors_reprs_or_breaker_state(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every way a connection with credentials ends: refused at open (password from the
    URL or from the environment), working, lost mid-run (the server killed), down at
    open, hung at open. Everything said about them -- log lines at every level with
    their tracebacks, errors, reprs, the breaker's last error -- is searched for each
    password."""
    caplog.set_level(logging.DEBUG)
    said: list[str] = []

    def attempt(options: RemoteOptions, environ: dict[str, str]) -> RemoteStore | None:
        said.append(repr(options))
        try:
            store = RemoteStore.open(FP, options, environ=environ)
        except ConfigError as e:
            said.extend([str(e), repr(e)])
            return None
        said.append(repr(store.options))
        return store

    wrong = "wrong-" + ALICE
    assert attempt(RemoteOptions(url=acl_url(acl_server, f"alice:{wrong}")), {}) is None
    env = RemoteOptions(url=acl_url(acl_server, "alice"), password_env="PW")
    assert attempt(env, {"PW": wrong}) is None
    good = attempt(RemoteOptions(url=acl_url(acl_server, f"alice:{ALICE}"), timeout_s=0.5), {})
    assert good is not None
    round_trip(good)
    acl_server.kill()
    for call in (
        lambda: good.write_many([key(1)], [payload(1)]),
        lambda: good.exists_many([key(1)]),
    ):
        with pytest.raises(TransferError) as lost:
            call()
        said.extend([str(lost.value), repr(lost.value), repr(lost.value.__cause__)])
    said.append(str(good.breaker.last_error))
    good.close()
    down = attempt(RemoteOptions(url=acl_url(acl_server, f"alice:{ALICE}"), timeout_s=0.5), {})
    assert down is not None and not down.healthy
    said.append(str(down.breaker.last_error))
    down.close()
    acl_server.start()
    acl_server.pause()
    hung = attempt(RemoteOptions(url=acl_url(acl_server, f"alice:{ALICE}"), timeout_s=0.5), {})
    assert hung is not None and not hung.healthy
    said.append(str(hung.breaker.last_error))
    hung.close()
    acl_server.resume()
    logged = [r.getMessage() for r in caplog.records] + [r.exc_text or "" for r in caplog.records]
    assert sum("did not answer at start" in line for line in logged) == 2  # down, hung
    for text in said + logged + caplog.text.splitlines():
        assert ALICE not in text and wrong not in text, text


@pytest.mark.parametrize(
    ("path", "config_key", "words"),
    [
        (f":{ALICE}@127.0.0.1:{{port}}/0", "remote_url", "called without any password configured"),
        ("127.0.0.1:{port}/99", "remote_url", "refused database 99"),
    ],
)
def test_a_password_for_a_server_without_one_or_a_database_it_lacks_is_refused_at_open(
    tmp_path: Path, path: str, config_key: str, words: str
) -> None:
    plain = RedisServer(tmp_path / "plain").start()
    try:
        url = "redis://" + path.format(port=plain.port)
        with pytest.raises(ConfigError, match=words) as error:
            RemoteStore.open(FP, RemoteOptions(url=url), environ={})
        assert error.value.key == config_key and ALICE not in str(error.value)
    finally:
        plain.stop()
