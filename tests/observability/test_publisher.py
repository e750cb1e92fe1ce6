"""The ZeroMQ publisher on real sockets: frames, sequence numbers, replay, bad settings."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import zmq

from kvtier.errors import ConfigError
from kvtier.observability.events import AllBlocksCleared, BlockRemoved, KVEventBatch
from kvtier.observability.publisher import END_SEQ, KVEventsConfig, ZmqEventPublisher

TIMEOUT_MS = 10_000


def _batch(i: int) -> KVEventBatch:
    return KVEventBatch(ts=float(i), events=[BlockRemoved([i], "CPU")])


def _recv(sock: zmq.Socket, timeout_ms: int = TIMEOUT_MS) -> list[bytes]:  # type: ignore[type-arg]
    assert sock.poll(timeout_ms), "nothing arrived"
    return sock.recv_multipart()


def test_batches_arrive_with_topic_and_sequence_and_replay_serves_the_buffer(
    tmp_path: Path,
) -> None:
    cfg = KVEventsConfig.from_dict(
        {
            "endpoint": f"ipc://{tmp_path}/pub",
            "replay_endpoint": f"ipc://{tmp_path}/replay",
            "topic": "kv",
            "buffer_steps": 3,
        }
    )
    pub = ZmqEventPublisher(cfg)
    ctx = zmq.Context.instance()
    sub, req = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)  # a DEALER takes every reply
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(pub.endpoint)
        req.connect(pub.replay_endpoint)
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        # Until the subscription is live, batches are lost (ZeroMQ's slow joiner):
        # publish until one arrives, as a real subscriber's first replay would cover.
        seen: dict[int, KVEventBatch] = {}
        while not seen:
            pub.publish(_batch(pub.published))
            if sub.poll(50):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv"
                seen[int.from_bytes(seq, "big")] = decoder.decode(payload)
        first_live = min(seen)
        for _ in range(5):
            pub.publish(_batch(pub.published))
        while max(seen) < pub.published - 1:
            topic, seq, payload = _recv(sub)
            seen[int.from_bytes(seq, "big")] = decoder.decode(payload)
        assert sorted(seen) == list(range(first_live, pub.published))
        for seq, batch in seen.items():
            assert batch == KVEventBatch(ts=float(seq), events=[BlockRemoved([seq], "CPU")],
                                         data_parallel_rank=0)  # fmt: skip
        n = pub.published

        def replay(start: int) -> list[tuple[bytes, int, KVEventBatch]]:
            req.send_multipart((b"", start.to_bytes(8, "big")))
            replayed = []
            while True:
                frames = _recv(req)
                if frames[2] == END_SEQ:
                    assert frames == [b"", b"", END_SEQ, b""]
                    return replayed
                empty, topic, seq, payload = frames
                assert empty == b""
                replayed.append((topic, int.from_bytes(seq, "big"), decoder.decode(payload)))

        # Only the last buffer_steps batches are kept; a replay starts where asked.
        assert [s for _, s, _ in replay(0)] == [n - 3, n - 2, n - 1]
        tail = replay(n - 2)
        assert [s for _, s, _ in tail] == [n - 2, n - 1]
        assert all(t == b"kv" and b == seen[s] for t, s, b in tail)
        assert replay(n) == []
    finally:
        pub.close()
        sub.close(linger=0)
        req.close(linger=0)


def test_a_subscriber_that_binds_receives_from_a_connecting_publisher(tmp_path: Path) -> None:
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=f"tcp://127.0.0.1:{port}"))
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"  # connected, not bound
        got = None
        while got is None:
            pub.publish(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
            if sub.poll(50):
                got = sub.recv_multipart()
        topic, _, payload = got
        assert topic == b""
        assert msgspec.msgpack.decode(payload) == [0.0, [{"type": "AllBlocksCleared"}], 0]
    finally:
        pub.close()
        sub.close(linger=0)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"endpont": "tcp://*:5557"}, "kv_events.endpont"),
        ({"endpoint": "http://x"}, "kv_events.endpoint"),
        ({"replay_endpoint": 5558}, "kv_events.replay_endpoint"),
        ({"buffer_steps": 0}, "kv_events.buffer_steps"),
        ({"hwm": True}, "kv_events.hwm"),
        ({"topic": 3}, "kv_events.topic"),
        ({"int_hashes": "yes"}, "kv_events.int_hashes"),
        ({"data_parallel_rank": -1}, "kv_events.data_parallel_rank"),
        ("tcp://*:5557", "kv_events"),
    ],
)
def test_bad_settings_name_their_key(raw: object, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        KVEventsConfig.from_dict(raw)  # type: ignore[arg-type]
    assert err.value.key == key


def test_an_endpoint_in_use_is_a_config_error(tmp_path: Path) -> None:
    first = ZmqEventPublisher(KVEventsConfig(endpoint=f"ipc://{tmp_path}/a",
                                             replay_endpoint="tcp://127.0.0.1:*"))  # fmt: skip
    try:
        assert first.replay_endpoint is not None
        with pytest.raises(ConfigError, match="replay_endpoint"):
            ZmqEventPublisher(KVEventsConfig(endpoint=f"ipc://{tmp_path}/b",
                                             replay_endpoint=first.replay_endpoint))  # fmt: skip
    finally:
        first.close()
