"""RemoteStore against a real redis-server: round trips, namespacing, sharing between
processes, corruption, eviction, TTL, passwords and option checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError, TransferError
from kvtier.media import block_format
from kvtier.media.circuit_breaker import Backoff, CircuitBreaker, Health
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore
from kvtier.media.remote_loop import BatchResult, Op, RemoteLoop
from kvtier.media.remote_options import Endpoint, redacted_url

from ..forking import held_by_another_thread, run_in_forked_child
from ..redis_server import RedisServer
from .test_block_format import version_1_header

FP = b"\x11" * 32
BLOCK = 64 * 1024
SRC = Path(__file__).resolve().parents[2] / "src"


def key(i: int) -> bytes:
    return i.to_bytes(2, "big") * 16


def payload(i: int, n: int = BLOCK) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


def open_store(server: RedisServer, fingerprint: bytes = FP, **kw: object) -> RemoteStore:
    return RemoteStore.open(fingerprint, RemoteOptions(url=server.url, **kw), environ={})  # type: ignore[arg-type]


@pytest.fixture
def store(server: RedisServer) -> Iterator[RemoteStore]:
    s = open_store(server)
    yield s
    s.close()


def read_back(store: RemoteStore, keys: list[bytes], n: int = BLOCK) -> tuple[list, np.ndarray]:
    outs = np.full((len(keys), n), 0xAB, dtype=np.uint8)
    return store.read_many_into(keys, list(outs)), outs


def test_round_trip_is_byte_identical(store: RemoteStore) -> None:
    keys = [key(i) for i in range(8)]
    store.write_many(keys, [payload(i) for i in range(8)])
    outcomes, outs = read_back(store, keys)
    assert outcomes == [ReadOutcome.HIT] * 8
    for i in range(8):
        assert np.array_equal(outs[i], payload(i))
    assert store.healthy


def test_values_are_verified_blocks_under_namespaced_keys(
    store: RemoteStore, server: RedisServer
) -> None:
    store.write_many([key(1)], [payload(1)])
    name = f"kvtier:v1:{FP.hex()}:{key(1).hex()}".encode()
    assert store.redis_key(key(1)) == name
    with server.client() as client:
        assert client.keys("*") == [name]
        value = client.get(name)
    size = block_format.header_size(32, 32)
    assert len(value) == size + BLOCK
    block_format.verify(value, value[size:], key=key(1), fingerprint=FP)


def test_other_fingerprint_is_a_miss(store: RemoteStore, server: RedisServer) -> None:
    store.write_many([key(1)], [payload(1)])
    other = open_store(server, b"\x22" * 32)
    outcomes, outs = read_back(other, [key(1)])
    assert outcomes == [ReadOutcome.MISS]
    assert not outs.any()
    assert other.exists_many([key(1)]) == [False]
    assert store.exists_many([key(1)]) == [True]
    other.close()


def test_exists_and_delete_many(store: RemoteStore) -> None:
    store.write_many([key(1), key(3)], [payload(1), payload(3)])
    assert store.exists_many([key(i) for i in range(5)]) == [False, True, False, True, False]
    assert store.exists_many([]) == []
    assert store.delete_many([key(1), key(2)]) == 1
    assert store.exists_many([key(1), key(3)]) == [False, True]


def test_missing_keys_are_misses_and_zeroed(store: RemoteStore) -> None:
    store.write_many([key(0)], [payload(0)])
    outcomes, outs = read_back(store, [key(0), key(9)])
    assert outcomes == [ReadOutcome.HIT, ReadOutcome.MISS]
    assert np.array_equal(outs[0], payload(0)) and not outs[1].any()


def test_large_batches_are_split_and_still_round_trip(server: RedisServer) -> None:
    store = open_store(server, batch_bytes=3 * BLOCK)  # 10 values: 4 pipelines
    keys = [key(i) for i in range(10)]
    store.write_many(keys, [payload(i) for i in range(10)])
    outcomes, outs = read_back(store, keys)
    assert outcomes == [ReadOutcome.HIT] * 10
    assert all(np.array_equal(outs[i], payload(i)) for i in range(10))
    store.close()


def test_second_process_reads_what_the_first_wrote(server: RedisServer) -> None:
    script = textwrap.dedent(f"""
        import numpy as np
        from kvtier.media.remote import RemoteOptions, RemoteStore
        store = RemoteStore.open({FP!r}, RemoteOptions(url={server.url!r}), environ={{}})
        keys = [i.to_bytes(2, "big") * 16 for i in range(4)]
        data = [np.random.default_rng(i).integers(0, 256, {BLOCK}, dtype=np.uint8)
                for i in range(4)]
        store.write_many(keys, data)
        store.close()
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    reader = open_store(server)
    outcomes, outs = read_back(reader, [key(i) for i in range(4)])
    assert outcomes == [ReadOutcome.HIT] * 4
    assert all(np.array_equal(outs[i], payload(i)) for i in range(4))
    reader.close()


@pytest.mark.parametrize("where", ["payload", "header"])
def test_corrupted_value_is_a_deleted_miss(
    store: RemoteStore, server: RedisServer, where: str
) -> None:
    store.write_many([key(1), key(2)], [payload(1), payload(2)])
    name = store.redis_key(key(1)).decode()
    offset = block_format.header_size(32, 32) + 1000 if where == "payload" else 40
    with server.client() as client:
        old = client.getrange(name, offset, offset)
    server.cli("SETRANGE", name, str(offset), "Z" if old != b"Z" else "Y")
    outcomes, outs = read_back(store, [key(1), key(2)])
    assert outcomes == [ReadOutcome.CORRUPT, ReadOutcome.HIT]
    assert not outs[0].any() and np.array_equal(outs[1], payload(2))
    assert store.exists_many([key(1), key(2)]) == [False, True]  # deleted
    assert store.healthy


def test_version_1_value_is_a_deleted_miss(store: RemoteStore, server: RedisServer) -> None:
    """A value a previous release stored (format 1, CRC-32) is never read as a block."""
    old = version_1_header(key(1), FP, payload(1).tobytes()) + payload(1).tobytes()
    with server.client() as client:
        client.set(store.redis_key(key(1)), old)
    outcomes, outs = read_back(store, [key(1)])
    assert outcomes == [ReadOutcome.CORRUPT] and not outs.any()
    assert store.exists_many([key(1)]) == [False]


def test_value_of_another_size_is_corrupt(store: RemoteStore) -> None:
    store.write_many([key(1)], [payload(1, BLOCK // 2)])
    outcomes, outs = read_back(store, [key(1)])
    assert outcomes == [ReadOutcome.CORRUPT] and not outs.any()


def test_foreign_value_under_our_key_is_corrupt(store: RemoteStore, server: RedisServer) -> None:
    with server.client() as client:
        client.set(store.redis_key(key(1)), b"not a block")
        client.rpush(store.redis_key(key(2)), b"a list")  # GET answers WRONGTYPE
    outcomes, _ = read_back(store, [key(1), key(2)])
    assert outcomes == [ReadOutcome.CORRUPT, ReadOutcome.CORRUPT]
    assert store.exists_many([key(1), key(2)]) == [False, False]
    assert store.healthy


def test_eviction_under_maxmemory_gives_misses_not_errors(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, ["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"])
    server.start()
    try:
        store = open_store(server)
        keys = [key(i) for i in range(40)]  # 10 MiB of values into 4 MiB
        for i in range(0, 40, 4):
            store.write_many(keys[i : i + 4], [payload(j, 256 * 1024) for j in range(i, i + 4)])
        outcomes, outs = read_back(store, keys, 256 * 1024)
        assert ReadOutcome.MISS in outcomes and ReadOutcome.HIT in outcomes
        assert ReadOutcome.CORRUPT not in outcomes
        for i, o in enumerate(outcomes):
            if o is ReadOutcome.HIT:
                assert np.array_equal(outs[i], payload(i, 256 * 1024))
            else:
                assert not outs[i].any()
        assert store.healthy
        store.close()
    finally:
        server.stop()


def test_noeviction_refusal_fails_the_write_but_not_the_store(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, ["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"])
    server.start()
    try:
        store = open_store(server)
        with pytest.raises(TransferError, match="refused"):
            for i in range(0, 40, 4):
                store.write_many([key(j) for j in range(i, i + 4)], [payload(j) for j in range(4)])
        assert store.healthy
        store.close()
    finally:
        server.stop()


def test_ttl_sets_an_expiry(server: RedisServer) -> None:
    store = open_store(server, ttl_s=60.0)
    store.write_many([key(1)], [payload(1)])
    with server.client() as client:
        assert 0 < client.pttl(store.redis_key(key(1))) <= 60_000
    store.close()


def test_password_comes_from_the_environment(tmp_path: Path) -> None:
    """The password is the variable's; without it a server that wants one is refused
    at open, naming the variable to set (never at the first batch)."""
    server = RedisServer(tmp_path, password="s3cret").start()
    try:
        options = RemoteOptions(url=server.url, password_env="KVTIER_TEST_PW")
        good = RemoteStore.open(FP, options, environ={"KVTIER_TEST_PW": "s3cret"})
        good.write_many([key(1)], [payload(1)])
        assert good.exists_many([key(1)]) == [True]
        good.close()
        with pytest.raises(ConfigError, match=r"requires a password.*set KVTIER_TEST_PW") as e:
            RemoteStore.open(FP, options, environ={})
        assert e.value.key == "remote_password_env"
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("kw", "config_key"),
    [
        ({"url": "http://127.0.0.1:6379"}, "remote_url"),
        ({"url": "redis://127.0.0.1:6379/zero"}, "remote_url"),
        ({"url": "redis://127.0.0.1:6379/0?password=pw"}, "remote_url"),
        ({"url": "redis://127.0.0.1:6379/1", "cluster": True}, "remote_url"),
        ({"url": "unix://"}, "remote_url"),
        ({"tls_ca_file": "ca.pem"}, "remote_tls_ca_file"),
        ({"tls_cert_file": "c.pem"}, "remote_tls_cert_file"),
        ({"url": "rediss://h", "tls_key_file": "k.pem"}, "remote_tls_key_file"),
        ({"url": "unix:///tmp/redis.sock", "cluster": True}, "remote_cluster"),
        ({"timeout_s": 0.0}, "remote_timeout_s"),
        ({"ttl_s": -1.0}, "remote_ttl_s"),
    ],
)
def test_bad_options_name_their_key(kw: dict, config_key: str) -> None:
    with pytest.raises(ConfigError) as info:
        RemoteOptions(**kw)
    assert info.value.key == config_key


def test_bad_keys_and_lengths_are_refused(store: RemoteStore) -> None:
    with pytest.raises(TransferError):
        store.write_many([b""], [payload(0)])
    with pytest.raises(ValueError):
        store.write_many([key(1)], [])
    with pytest.raises(ValueError):
        RemoteStore.open(b"", RemoteOptions())


def test_a_store_leaves_its_connection_ready_for_short_replies(server: RedisServer) -> None:
    """A store raises the socket's receive low-water mark to its batch's replies
    (``SO_RCVLOWAT``, one wake-up for them all); the connection goes back to the pool
    with the mark at 1, else the next short reply on it (``:1`` to ``EXISTS``) would
    wait out the timeout. One connection, so every call uses the same socket."""
    s = open_store(server, max_connections=1, timeout_s=0.5)
    try:
        s.write_many([key(i) for i in range(8)], [payload(i) for i in range(8)])
        assert s.exists_many([key(0)]) == [True]
        assert s.delete_many([key(1)]) == 1
        assert s.ping()
        assert s.healthy
    finally:
        s.close()


def test_batches_reuse_an_idle_connection_and_never_a_dead_one(server: RedisServer) -> None:
    """Store and load batches keep their connection between batches (one connection
    for a thread's batches); one the server closed while idle is replaced, not used:
    the next batch succeeds and the store stays healthy."""
    s = open_store(server, max_connections=4)
    keys, data = [key(i) for i in range(4)], [payload(i) for i in range(4)]
    try:
        for _ in range(3):
            s.write_many(keys, data)
            assert read_back(s, keys)[0] == [ReadOutcome.HIT] * 4
        admin = server.client()
        ours = [c for c in admin.client_list() if c["id"] != str(admin.client_id())]
        assert len(ours) == 1
        admin.client_kill_filter(_id=ours[0]["id"])  # closed by the server while idle
        s.write_many(keys, data)
        outcomes, outs = read_back(s, keys)
        assert outcomes == [ReadOutcome.HIT] * 4 and np.array_equal(outs, np.stack(data))
        assert s.healthy and s.breaker.failures == 0
    finally:
        s.close()


def test_a_thread_waiting_for_a_connection_gets_the_next_one_released(
    server: RedisServer,
) -> None:
    """Two connections, both held; a third user blocks in the pool. When one holder
    finishes, its connection must go to the pool (which wakes the waiter), not to the
    idle stack the waiter no longer looks at: else the waiter times out with one idle."""
    s = open_store(server, max_connections=2, timeout_s=10.0)
    link = s._connections()
    release_a, release_b, holding = threading.Event(), threading.Event(), threading.Barrier(3)
    got: list[object] = []

    def hold(release: threading.Event) -> None:
        with link.owned():
            holding.wait()
            release.wait()

    def third() -> None:
        try:
            with link.owned() as conn:
                got.append(conn)
        except Exception as exc:  # the pool's "no connection available"
            got.append(exc)

    holders = [threading.Thread(target=hold, args=(e,)) for e in (release_a, release_b)]
    try:
        for t in holders:
            t.start()
        holding.wait()
        waiter = threading.Thread(target=third)
        waiter.start()
        time.sleep(0.2)  # the third user is blocked in the pool by now
        release_a.set()
        waiter.join(30)
        assert len(got) == 1 and not isinstance(got[0], Exception), got
    finally:
        release_a.set()
        release_b.set()
        for t in holders:
            t.join()
        s.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: threads
def test_a_forked_child_starts_afresh_while_a_parent_thread_holds_the_lock(
    server: RedisServer,
) -> None:
    """A child forked while another thread of the parent holds ``Connections``' lock
    (which that thread never releases in the child) loads its blocks, on a connection
    of its own, never the idle socket the parent shares with it."""
    s = open_store(server, max_connections=4)
    keys, data = [key(i) for i in range(2)], [payload(i) for i in range(2)]
    try:
        s.write_many(keys, data)
        link = s._connections()
        with link.owned() as conn:
            parents = conn  # parked idle now

        def child() -> bool:  # the lock still taken in its memory
            with link.owned() as conn:
                fresh = conn is not parents
            outcomes, outs = read_back(s, keys)
            return fresh and outcomes == [ReadOutcome.HIT] * 2 and np.array_equal(outs, data)

        with held_by_another_thread(link._lock) as release:
            run_in_forked_child(child, release.set)
        assert read_back(s, keys)[0] == [ReadOutcome.HIT] * 2  # the parent's link still works
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: threads
@pytest.mark.parametrize("which", ["breaker", "store"])
def test_a_forked_child_loads_while_a_parent_thread_holds_the_breaker_or_store_lock(
    server: RedisServer, which: str
) -> None:
    """Every load takes the breaker's lock (``allow``, ``record_success``) and the
    store's (``_connect``): a child forked while another thread of the parent holds
    either still loads its blocks."""
    s = open_store(server)
    keys, data = [key(i) for i in range(2)], [payload(i) for i in range(2)]
    try:
        s.write_many(keys, data)

        def child() -> bool:
            outcomes, outs = read_back(s, keys)
            return outcomes == [ReadOutcome.HIT] * 2 and np.array_equal(outs, data)

        with held_by_another_thread(s.breaker._lock if which == "breaker" else s._lock) as release:
            run_in_forked_child(child, release.set)
        assert read_back(s, keys)[0] == [ReadOutcome.HIT] * 2
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: threads
def test_a_child_forked_while_the_parent_probes_the_store_probes_it_itself(
    server: RedisServer,
) -> None:
    """The parent's breaker is ``PROBING`` at the fork (a parent thread's probe in
    flight, which the child will never see end): the child's breaker does not wait for
    it forever, it probes the (healthy) server itself and loads."""
    now = [0.0]
    breaker = CircuitBreaker(Backoff(base_s=1.0, max_s=1.0), clock=lambda: now[0])
    options = RemoteOptions(url=server.url)
    s = RemoteStore.open(FP, options, breaker=breaker, environ={})
    keys, data = [key(i) for i in range(2)], [payload(i) for i in range(2)]
    try:
        s.write_many(keys, data)
        breaker.record_failure("lost")  # an outage ...
        now[0] = 10.0  # ... whose backoff expired
        assert breaker.allow() and breaker.state is Health.PROBING  # the parent's probe

        def child() -> bool:
            outcomes, outs = read_back(s, keys)
            hits = outcomes == [ReadOutcome.HIT] * 2 and np.array_equal(outs, data)
            return hits and breaker.state is Health.HEALTHY

        run_in_forked_child(child, lambda: None)
        assert breaker.state is Health.PROBING  # the parent's own probe is still its own
        breaker.record_success()
    finally:
        s.close()


@pytest.mark.parametrize(
    ("url", "fields"),
    [
        ("redis://h", (False, "h", 6379, None, 0, None, None)),
        (
            "rediss://alice:p%40ss@10.0.0.2:7000/3",
            (True, "10.0.0.2", 7000, None, 3, "alice", "p@ss"),
        ),
        ("redis://bob@[::1]:6380/", (False, "::1", 6380, None, 0, "bob", None)),
        ("unix:///run/redis.sock?db=2", (False, None, 0, "/run/redis.sock", 2, None, None)),
        ("unix://:pw@/run/redis.sock", (False, None, 0, "/run/redis.sock", 0, None, "pw")),
    ],
)
def test_a_url_names_its_endpoint(url: str, fields: tuple[object, ...]) -> None:
    e = Endpoint.parse(url)
    assert (e.tls, e.host, e.port, e.path, e.db, e.username, e.password) == fields


def test_credentials_are_left_out_of_the_options_repr() -> None:
    shown = repr(RemoteOptions(url="rediss://alice:s3cret@h:1/2", tls_ca_file="ca.pem"))
    assert "s3cret" not in shown and "alice" not in shown
    assert "url='rediss://h:1/2'" in shown and "tls_ca_file='ca.pem'" in shown
    assert redacted_url("unix://:pw@/run/r.sock?db=1") == "unix:///run/r.sock"


def test_options_from_a_configuration_carry_every_remote_key() -> None:
    cfg = OffloadingConfig.from_dict(
        {
            "cpu_bytes_to_use": "1MiB",
            "remote_url": "rediss://h:1/2",
            "remote_timeout_s": 2.5,
            "remote_password_env": "PW",
            "remote_io_threads": 3,
            "remote_ttl_s": 9.0,
            "remote_tls_ca_file": "ca.pem",
            "remote_tls_cert_file": "client.pem",
            "remote_tls_key_file": "client.key",
            "remote_backoff_s": 0.25,
        }
    )
    o = RemoteOptions.from_config(cfg)
    got = (o.url, o.cluster, o.timeout_s, o.password_env, o.ttl_s, o.max_connections)
    assert got == ("rediss://h:1/2", False, 2.5, "PW", 9.0, 8)
    assert (o.tls_ca_file, o.tls_cert_file, o.tls_key_file) == (
        "ca.pem",
        "client.pem",
        "client.key",
    )
    assert o.backoff.base_s == 0.25 and o.batch_bytes == RemoteOptions().batch_bytes
    with pytest.raises(ConfigError) as e:
        RemoteOptions.from_config(OffloadingConfig.from_dict({"cpu_bytes_to_use": "1MiB"}))
    assert e.value.key == "remote_url"


def test_a_bad_remote_url_is_reported_by_its_scheme_only() -> None:
    """The URL may hold a password: the configuration's error shows its scheme."""
    with pytest.raises(ConfigError) as e:
        OffloadingConfig.from_dict({"cpu_bytes_to_use": "1MiB", "remote_url": "http://u:pw@h"})
    assert e.value.key == "remote_url" and "pw" not in str(e.value) and "'http'" in str(e.value)


def test_a_unix_socket_store_round_trips_through_store_and_loop(tmp_path: Path) -> None:
    """``unix://<path>?db=1``: the store's own connection over a Unix socket, its
    database selected, multiplexed by the I/O loop like a TCP one."""
    path = tmp_path / "redis.sock"
    server = RedisServer(tmp_path / "unix", ["--unixsocket", str(path), "--unixsocketperm", "700"])
    server.start()
    store = RemoteStore.open(FP, RemoteOptions(url=f"unix://{path}?db=1"), environ={})
    loop = RemoteLoop(store, connections=2, name="test-unix-loop")
    try:
        assert store.healthy and store.multiplexable
        keys = [key(i) for i in range(4)]
        store.write_many(keys[:2], [payload(0), payload(1)])
        done: list[BatchResult] = []
        loop.submit(Op.STORE, keys[2:], [payload(2), payload(3)], done.append)
        outs = np.zeros((4, BLOCK), np.uint8)
        loop.submit(Op.LOAD, keys, list(outs), done.append)
        loop.close()
        assert [r.error for r in done] == [None, None]
        assert list(done[1].outcomes) == [ReadOutcome.HIT] * 4
        assert all(np.array_equal(outs[i], payload(i)) for i in range(4))
        with server.client() as client:
            assert client.dbsize() == 0  # database 0: the values went to database 1
            client.select(1)
            assert client.dbsize() == 4
    finally:
        loop.close()
        store.close()
        server.stop()
