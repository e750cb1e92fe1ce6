"""Reading block values back from Redis: each into its CPU page, verified there.

Runs in the I/O threads of a ``RemoteStore`` (worker side); imports no torch. Two
paths, one outcome per key (``ReadOutcome``):

* ``get_into_pages`` (single node): pipelined ``GET`` on one pooled connection, each
  reply read by ``ReplyReader`` straight into its page, then verified in place;
* ``accept`` (cluster, where redis-py's cluster pipeline returns ``bytes``): verify a
  fetched value, then copy its payload into the page.

Either way a value that is not a verified block of this key and fingerprint (bad
header or checksum, wrong length, another Redis type) leaves its page zero-filled and
is reported ``CORRUPT``; the store deletes it.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError

from kvtier.errors import IntegrityError
from kvtier.media import block_format
from kvtier.media.block_format import Corruption
from kvtier.media.redis_client import ReplyReader

logger = logging.getLogger("kvtier.media.remote")


class ReadOutcome(str, enum.Enum):
    """What ``read_many_into`` found for one key."""

    HIT = "hit"
    """Verified and copied into its buffer."""
    MISS = "miss"
    """Not stored: never written, evicted, expired, or the server restarted empty."""
    CORRUPT = "corrupt"
    """Stored but failed verification; deleted, never served."""


def get_into_pages(
    client: Any, *, fingerprint: bytes, batch: list[tuple[bytes, bytes, np.ndarray]]
) -> list[ReadOutcome]:
    """Pipelined GETs on one pooled connection, each value read into its page."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands([("GET", name) for _, name, _ in batch]))
        reader = ReplyReader(conn._sock)  # see ReplyReader: we own the connection
        return [receive(reader, fingerprint, key, dest) for key, _, dest in batch]
    except BaseException:
        conn.disconnect()  # replies may be left unread: never reuse it
        raise
    finally:
        pool.release(conn)


def receive(reader: ReplyReader, fingerprint: bytes, key: bytes, dest: np.ndarray) -> ReadOutcome:
    """Read one GET reply into ``dest`` and verify it there (zeroed if it fails)."""
    line = reader.line()
    size = block_format.header_size(len(key), len(fingerprint))
    if line in (b"$-1", b"_"):  # nil in RESP2, null in RESP3
        dest[:] = 0
        return ReadOutcome.MISS
    if line.startswith(b"-"):  # an error reply: a foreign value (WRONGTYPE, ...)
        return _reject(key, dest, line.decode(errors="replace"))
    if line.startswith(b"!"):  # a RESP3 blob error
        reader.skip(int(line[1:]) + 2)
        return _reject(key, dest, "error reply")
    if not line.startswith(b"$"):
        raise RedisConnectionError(f"unexpected reply to GET: {line[:40]!r}")
    length = int(line[1:])
    if length != size + dest.nbytes:
        reader.skip(length + 2)
        return _reject(key, dest, f"value of {length} bytes, expected {size + dest.nbytes}")
    header, crlf = bytearray(size), bytearray(2)
    for part in (memoryview(header), dest.data, memoryview(crlf)):
        reader.read_into(part)
    if crlf != b"\r\n":
        raise RedisConnectionError("a bulk reply not ended by CRLF")
    try:
        block_format.verify(header, dest.data, key=key, fingerprint=fingerprint)
    except IntegrityError as e:
        return _reject(key, dest, str(e))
    return ReadOutcome.HIT


def accept(fingerprint: bytes, key: bytes, value: Any, dest: np.ndarray) -> ReadOutcome:
    """Verify one fetched value and copy its payload into ``dest``."""
    if value is None:
        dest[:] = 0
        return ReadOutcome.MISS
    if isinstance(value, Exception):  # an error reply: a foreign value (WRONGTYPE, ...)
        return _reject(key, dest, str(value))
    view = memoryview(value)
    size = block_format.header_size(len(key), len(fingerprint))
    try:
        h = block_format.verify(view, view[size:], key=key, fingerprint=fingerprint)
        if h.payload_length != dest.nbytes:
            raise block_format.corruption(
                Corruption.LENGTH_MISMATCH,
                f"value holds {h.payload_length} bytes, the buffer takes {dest.nbytes}",
            )
    except IntegrityError as e:
        return _reject(key, dest, str(e))
    dest[:] = np.frombuffer(view, dtype=np.uint8, offset=size)
    return ReadOutcome.HIT


def _reject(key: bytes, dest: np.ndarray, why: str) -> ReadOutcome:
    logger.warning("remote block %s failed verification: %s", key.hex()[:16], why)
    dest[:] = 0
    return ReadOutcome.CORRUPT
