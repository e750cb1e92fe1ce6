"""RemoteStore over a three-node Redis Cluster: batches whose keys span every node."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvtier.media.remote import ReadOutcome, RemoteOptions, RemoteStore

from ..redis_server import RedisCluster

FP = b"\x55" * 32
BLOCK = 16 * 1024
N = 48


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def data(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture
def store(cluster: RedisCluster) -> Iterator[RemoteStore]:
    s = RemoteStore.open(FP, RemoteOptions(url=cluster.url, cluster=True), environ={})
    yield s
    s.close()


def test_round_trip_across_nodes(store: RemoteStore, cluster: RedisCluster) -> None:
    keys = [key(i) for i in range(N)]
    store.write_many(keys, [data(i) for i in range(N)])
    per_node = [int(n.cli("DBSIZE")) for n in cluster.nodes]
    assert sum(per_node) == N and all(per_node)  # the batch reached every node
    outs = np.zeros((N + 1, BLOCK), np.uint8)
    outcomes = store.read_many_into([*keys, key(999)], list(outs))
    assert outcomes == [ReadOutcome.HIT] * N + [ReadOutcome.MISS]
    assert all(np.array_equal(outs[i], data(i)) for i in range(N))
    assert store.exists_many([key(0), key(999), key(N - 1)]) == [True, False, True]
    assert store.delete_many(keys) == N
    assert store.exists_many(keys) == [False] * N
    assert store.healthy


def test_corrupt_value_on_a_cluster_is_deleted(store: RemoteStore, cluster: RedisCluster) -> None:
    store.write_many([key(1), key(2)], [data(1), data(2)])
    name = store.redis_key(key(1)).decode()
    cluster.nodes[0].cli("-c", "SETRANGE", name, "500", "garbage")  # -c: follow MOVED
    outs = np.zeros((2, BLOCK), np.uint8)
    assert store.read_many_into([key(1), key(2)], list(outs)) == [
        ReadOutcome.CORRUPT,
        ReadOutcome.HIT,
    ]
    assert store.exists_many([key(1), key(2)]) == [False, True]
    store.delete_many([key(2)])
