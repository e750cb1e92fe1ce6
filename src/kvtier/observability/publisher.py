"""Publishing KV event batches over ZeroMQ, as vLLM's ``ZmqEventPublisher`` does.

Runs in the engine process: ``publish`` is called from the engine's thread and only
queues; one background thread owns the sockets (ZeroMQ sockets are not thread-safe)::

    engine thread ── publish(batch) ──► queue ──► publisher thread ── PUB ──► subscribers
                                                        ▲   └─ keeps the last
                                   replay request ──► ROUTER   ``buffer_steps`` batches

Wire protocol (the same as vLLM's, so its subscribers work unchanged):

* PUB sends three frames per batch: ``topic`` (UTF-8), the batch's sequence number
  (8 bytes, big-endian, from 0), and the msgpack payload (``events.KVEventBatch``).
* With a ``replay_endpoint`` a ROUTER socket answers a request ``(b"", start_seq)``
  (a DEALER's frames, or a REQ's ``start_seq`` alone; 8 bytes big-endian) with every
  buffered batch whose number is ``>= start_seq``, each as
  ``(b"", topic, seq, payload)``, then ``(b"", b"", -1 as 8 signed bytes, b"")``.
  A DEALER receives them all; a REQ socket (as in vLLM's example subscriber) keeps
  only the first reply of each request, as it does with vLLM's publisher.
* An endpoint with ``*`` or ``::`` in it, or an ``ipc://`` / ``inproc://`` one, is
  bound; any other is connected to (a subscriber that binds). The replay endpoint is
  always bound.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from kvtier.config import non_negative_int, positive_int
from kvtier.errors import ConfigError
from kvtier.observability.events import EventBatch

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay."""


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """Where and how KV events are published (vLLM's keys and defaults).

    Attributes:
        endpoint: the PUB socket's address (bound or connected, see the module doc).
        topic: the first frame of every message; subscribers filter on it.
        replay_endpoint: the ROUTER socket that serves replays (``None``: no replay).
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's high-water mark (messages queued per subscriber).
        max_queue_size: batches queued between the engine and the publisher thread;
            beyond it batches are dropped and counted, the engine never waits.
        int_hashes: carry each block key's low 64 bits as an integer instead of its
            bytes (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
        data_parallel_rank: the rank stamped on every batch.
    """

    endpoint: str = "tcp://*:5557"
    topic: str = ""
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    int_hashes: bool = False
    data_parallel_rank: int = 0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> KVEventsConfig:
        """Validate the ``kv_events`` settings.

        Raises:
            ConfigError: an unknown key, or a value of the wrong kind (named
                ``kv_events.<key>``).
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("kv_events", f"must be a dict of keys, got {raw!r}")
        known = cls.__dataclass_fields__
        for key in raw:
            if key not in known:
                raise ConfigError(f"kv_events.{key}", f"unknown key; known: {', '.join(known)}")
        for key in ("endpoint", "topic"):
            if key in raw and not isinstance(raw[key], str):
                raise ConfigError(f"kv_events.{key}", f"must be a string, got {raw[key]!r}")
        endpoint = raw.get("endpoint", known["endpoint"].default)
        replay = raw.get("replay_endpoint")
        for key, value in (("endpoint", endpoint), ("replay_endpoint", replay)):
            if value is not None and (not isinstance(value, str) or not value.startswith(_SCHEMES)):
                raise ConfigError(
                    f"kv_events.{key}",
                    f"must be a ZeroMQ address ({', '.join(_SCHEMES)}...), got {value!r}",
                )
        for key in ("buffer_steps", "hwm", "max_queue_size"):
            positive_int(f"kv_events.{key}", raw.get(key, known[key].default))
        non_negative_int("kv_events.data_parallel_rank", raw.get("data_parallel_rank", 0))
        if not isinstance(raw.get("int_hashes", False), bool):
            raise ConfigError("kv_events.int_hashes", "must be true or false")
        return cls(**raw)


_SCHEMES = ("tcp://", "ipc://", "inproc://")


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Publishes ``EventBatch`` values; see the module docstring.

    Args:
        config: the endpoints and limits.
        context: the ZeroMQ context (the process-wide one by default).

    Raises:
        ConfigError: an endpoint cannot be bound or connected (e.g. the port is taken).
    """

    def __init__(self, config: KVEventsConfig, context: zmq.Context[Any] | None = None) -> None:
        self.config = config
        self.dropped = 0
        """Batches dropped because the queue to the publisher thread was full."""
        self._topic = config.topic.encode()
        self.published = 0
        """Batches queued so far; the next batch gets this sequence number."""
        self._queue: queue.Queue[tuple[int, EventBatch] | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        ctx = context or zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[Any] | None = None
        try:
            self._pub.set_hwm(config.hwm)
            self.endpoint = self._open(self._pub, "endpoint", config.endpoint)
            self.replay_endpoint: str | None = None
            if config.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
                self.replay_endpoint = self._open(
                    self._replay, "replay_endpoint", config.replay_endpoint, bind=True
                )
        except BaseException:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._serve, name="kvtier-kv-events", daemon=True)
        self._thread.start()

    @staticmethod
    def _open(sock: zmq.Socket[Any], key: str, endpoint: str, bind: bool = False) -> str:
        """Bind or connect; the address really used (a bound port 0 or ``*`` resolved)."""
        try:
            if bind or _binds(endpoint):
                sock.bind(endpoint)
                return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            sock.connect(endpoint)
            return endpoint
        except zmq.ZMQError as e:
            raise ConfigError(f"kv_events.{key}", f"cannot use {endpoint!r}: {e}") from e

    def publish(self, batch: EventBatch) -> None:
        """Queue a batch for sending; never blocks (a full queue drops it, counted)."""
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.config.data_parallel_rank
        try:
            self._queue.put_nowait((self.published, batch))
        except queue.Full:
            self.dropped += 1
            return
        self.published += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (up to ``timeout_s``), then close the sockets."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("KV event publisher did not finish within %.1f s", timeout_s)
        else:
            self._close_sockets(linger_ms=round(timeout_s * 1000))

    # -- the publisher thread ------------------------------------------------------------

    def _serve(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._answer_replay()
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, batch = item
            payload = encoder.encode(batch)
            seq_bytes = seq.to_bytes(8, "big")
            try:
                self._pub.send_multipart((self._topic, seq_bytes, payload))
            except zmq.ZMQError:
                logger.exception("KV event batch %d could not be sent", seq)
            self._buffer.append((seq, payload))

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("ignored a malformed KV event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                reply = (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                self._replay.send_multipart(reply)
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self, linger_ms: int = 0) -> None:
        self._pub.close(linger=linger_ms)  # lets subscribers receive what was sent
        if self._replay is not None:
            self._replay.close(linger=0)
