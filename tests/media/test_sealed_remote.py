"""A remote store with an encryption key, against real ``redis-server`` processes -- a
plain one, one on TLS only with client certificates, one taking an ACL user -- and a
three-node cluster: no plaintext in any value the server holds, the same key hits
through the store's batches and through the I/O loop, and every value that is not
this key's, this model's and this name's -- another key, no key, a plaintext value,
values swapped or renamed -- is ``UNDECRYPTABLE``, zero-filled and deleted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.key_file import EncryptionKey
from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore
from kvtier.media.remote_loop import BatchResult, Op, RemoteLoop

from ..certificates import make_certificates
from ..redis_server import RedisCluster, RedisServer, require_redis

FP = b"\x4e" * 32
BLOCK = 32 * 1024
OLD, NEW = EncryptionKey.of(b"o" * 32), EncryptionKey.of(b"n" * 32)
ALICE = "alice-pw-31c7"
HIT, UNDECRYPTABLE = ReadOutcome.HIT, ReadOutcome.UNDECRYPTABLE


def key(i: int) -> bytes:
    return bytes([i]) * 32


def payload(i: int) -> np.ndarray:
    return np.random.default_rng(100 + i).integers(0, 256, BLOCK, dtype=np.uint8)


def windows(i: int) -> list[bytes]:
    raw = payload(i).tobytes()
    return [raw[at : at + 64] for at in (0, BLOCK // 3, BLOCK - 64)]


@pytest.fixture(params=["plain", "tls", "acl"])
def server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[RedisServer, dict[str, Any]]]:
    """A server and the ``RemoteOptions`` arguments that reach it."""
    require_redis()
    if request.param == "tls":
        certs = make_certificates(tmp_path / "certs")
        s = RedisServer(tmp_path / "tls", tls=certs)
        files = {"tls_ca_file": str(certs.ca), "tls_cert_file": str(certs.client_cert),
                 "tls_key_file": str(certs.client_key)}  # fmt: skip
        options = {"url": s.url, **files}
    elif request.param == "acl":
        acl = tmp_path / "users.acl"
        acl.write_text(f"user default off\nuser alice on >{ALICE} ~kvtier:* +@all\n")
        s = RedisServer(tmp_path / "acl", ["--aclfile", str(acl)], username="alice",
                        password=ALICE)  # fmt: skip
        options = {"url": f"redis://alice:{ALICE}@127.0.0.1:{s.port}/0"}
    else:
        s = RedisServer(tmp_path / "plain")
        options = {"url": s.url}
    s.start()
    yield s, {**options, "timeout_s": 5.0}
    s.stop()


def open_store(
    options: dict[str, Any], keys: tuple[EncryptionKey, ...], fp: bytes = FP
) -> RemoteStore:
    return RemoteStore.open(fp, RemoteOptions(**options), environ={}, keys=keys)


def store_all(store: RemoteStore, ids: range, *, loop: bool = False) -> None:
    keys, pages = [key(i) for i in ids], [payload(i) for i in ids]
    if not loop:
        store.write_many(keys, pages)
        return
    done: list[BatchResult] = []
    remote_loop = RemoteLoop(store, connections=2, name="test-sealed-store")
    remote_loop.submit(Op.STORE, keys, pages, done.append)
    remote_loop.close()
    assert [r.error for r in done] == [None]


def load_all(store: RemoteStore, ids: range, *, loop: bool = False) -> list[ReadOutcome]:
    """Each block's outcome; a hit's bytes are checked, any other page must be zeros."""
    outs = np.full((len(ids), BLOCK), 0xAB, np.uint8)
    if loop:
        done: list[BatchResult] = []
        remote_loop = RemoteLoop(store, connections=2, name="test-sealed-load")
        remote_loop.submit(Op.LOAD, [key(i) for i in ids], list(outs), done.append)
        remote_loop.close()
        outcomes = list(done[0].outcomes)
    else:
        outcomes = store.read_many_into([key(i) for i in ids], list(outs))
    for i, outcome, out in zip(ids, outcomes, outs, strict=True):
        if outcome is HIT:
            assert np.array_equal(out, payload(i)), i
        else:
            assert not out.any(), i
    return outcomes


def server_values(server: RedisServer) -> dict[bytes, bytes]:
    with server.client() as client:
        return {name: client.get(name) for name in client.keys("kvtier:*")}


@pytest.mark.parametrize("loop", [False, True], ids=["batches", "loop"])
def test_no_plaintext_in_the_server_and_the_same_key_hits(
    server: tuple[RedisServer, dict[str, Any]], loop: bool
) -> None:
    s, options = server
    plain = open_store(options, (), fp=b"\x4f" * 32)
    store_all(plain, range(4), loop=loop)
    held = b"".join(server_values(s).values())
    assert all(w in held for i in range(4) for w in windows(i))  # the grep finds plaintext
    with s.client() as client:
        client.flushdb()
    plain.close()
    store = open_store(options, (NEW,))
    store_all(store, range(4), loop=loop)
    held = b"".join(server_values(s).values())
    assert len(server_values(s)) == 4
    assert not any(w in held for i in range(4) for w in windows(i))
    assert load_all(store, range(4), loop=loop) == [HIT] * 4
    store.close()
    again = open_store(options, (NEW,))  # another engine with the same key file
    assert load_all(again, range(4), loop=not loop) == [HIT] * 4
    again.close()


@pytest.mark.parametrize(
    ("writer", "reader"),
    [((OLD,), (NEW,)), ((NEW,), ()), ((), (NEW,))],
    ids=["another key", "no key", "plaintext to a keyed tier"],
)
@pytest.mark.parametrize("loop", [False, True], ids=["batches", "loop"])
def test_values_of_another_key_or_format_are_undecryptable_and_deleted(
    server: tuple[RedisServer, dict[str, Any]],
    writer: tuple[EncryptionKey, ...],
    reader: tuple[EncryptionKey, ...],
    loop: bool,
) -> None:
    s, options = server
    first = open_store(options, writer)
    store_all(first, range(3))
    first.close()
    second = open_store(options, reader)
    assert load_all(second, range(3), loop=loop) == [UNDECRYPTABLE] * 3
    assert server_values(s) == {}  # deleted: never read again, never served
    store_all(second, range(3))
    assert load_all(second, range(3), loop=loop) == [HIT] * 3
    second.close()


@pytest.mark.parametrize("loop", [False, True], ids=["batches", "loop"])
def test_values_swapped_or_renamed_open_under_no_other_name(
    server: tuple[RedisServer, dict[str, Any]], loop: bool
) -> None:
    """Each value stays a well-formed block sealed with this very key: only the block
    key in the seal's associated data tells it is not the block asked for."""
    s, options = server
    store = open_store(options, (NEW,))
    store_all(store, range(4))
    a, b, c = (store.redis_key(key(i)) for i in (0, 1, 2))
    with s.client() as client:
        va, vb = client.get(a), client.get(b)
        client.set(a, vb)
        client.set(b, va)
        client.rename(c, store.redis_key(key(9)))  # block 2's value under block 9's name
    assert load_all(store, range(4), loop=loop) == [
        UNDECRYPTABLE,
        UNDECRYPTABLE,
        ReadOutcome.MISS,
        HIT,
    ]
    assert load_all(store, range(9, 10), loop=loop) == [UNDECRYPTABLE]
    store.close()


def test_rotation_the_new_key_seals_the_old_one_still_opens(
    server: tuple[RedisServer, dict[str, Any]],
) -> None:
    s, options = server
    old = open_store(options, (OLD,))
    store_all(old, range(3))
    old.close()
    rotated = open_store(options, (NEW, OLD))
    assert load_all(rotated, range(3)) == [HIT] * 3
    store_all(rotated, range(3, 5), loop=True)
    assert server_values(s)[rotated.redis_key(key(4))][20:28] == NEW.key_id
    rotated.close()
    retired = open_store(options, (NEW,))
    assert load_all(retired, range(5), loop=True) == [UNDECRYPTABLE] * 3 + [HIT] * 2
    retired.close()


def test_a_cluster_holds_no_plaintext_and_refuses_other_keys_values(cluster: RedisCluster) -> None:
    options = {"url": cluster.url, "cluster": True}
    store = open_store(options, (NEW,))
    store_all(store, range(12))
    held = b""
    for node in cluster.nodes:
        with node.client() as client:
            held += b"".join(client.get(n) for n in client.keys("kvtier:*"))
    assert len(held) == 12 * (80 + BLOCK)
    assert not any(w in held for i in range(12) for w in windows(i))
    assert load_all(store, range(12)) == [HIT] * 12
    store.close()
    other = open_store(options, (OLD,))
    assert load_all(other, range(12)) == [UNDECRYPTABLE] * 12
    assert load_all(other, range(12)) == [ReadOutcome.MISS] * 12  # they were deleted
    other.close()
