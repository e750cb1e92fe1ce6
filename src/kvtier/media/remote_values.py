"""Block values to and from Redis: sent from their CPU pages, read back into them.

Runs in the I/O threads of a ``RemoteStore`` (worker side); imports no torch.

Writing (single node): ``set_from_pages`` sends a batch of ``SET`` on one connection
(``Connections.owned``) with ``send_buffers`` (header and page as their own buffers, one
``sendmsg`` for the batch) and reads the ``+OK`` replies with ``ReplyReader``; a
refused value (``-OOM ...``) comes back as its ``ErrorReply``, any other reply fails
the batch as a lost connection. The replies are read under ``SO_RCVLOWAT``
(``replies_awaited``): one wake-up for the batch's replies, not one per few. A
generic client's pipeline costs 4.7 system calls per value; this path 0.6.

Reading, two paths, one outcome per key (``ReadOutcome``):

* ``get_into_pages`` (single node): ``GET`` on one connection, a window of requests
  outstanding (``get_window``: two of 256 KiB, one of 1 MiB; the next sent as a reply
  is read, so the server never holds a whole batch of replies), each reply read by
  ``ReplyReader`` straight into its page (header, payload and CRLF in one call), then
  opened there by the store's codec (``opened``; a plaintext header is compared with
  the one kvtier writes for those bytes, decoded only if it differs; a sealed value
  lands in a buffer of its own and is decrypted into the page);
* ``accept`` (cluster, whose redis-py pipeline returns ``bytes``): copy a fetched
  value's payload into the page (or the codec's buffer) and open it.

Either way a value that is not a verified block of this key and fingerprint (bad
header or checksum, wrong length, another Redis type) leaves its page zero-filled and
is reported ``CORRUPT``; one whose seal does not open (another key, none, moved,
forged), or a value of the other format, ``UNDECRYPTABLE``. The store deletes both.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import numpy as np

from kvtier.errors import IntegrityError
from kvtier.media.block_codec import BlockCodec
from kvtier.media.block_format import Corruption
from kvtier.media.redis_client import Connections
from kvtier.media.resp import BlockValue, ErrorReply, ReplyReader, send_buffers

logger = logging.getLogger("kvtier.media.remote")


class ReadOutcome(str, enum.Enum):
    """What ``read_many_into`` found for one key."""

    HIT = "hit"
    """Verified and copied into its buffer."""
    MISS = "miss"
    """Not stored: never written, evicted, expired, or the server restarted empty."""
    CORRUPT = "corrupt"
    """Stored but failed verification; deleted, never served."""
    UNDECRYPTABLE = "undecryptable"
    """Stored but its seal does not open here, or it is of the other format (sealed
    for a tier without a key, plaintext for one with a key); deleted, never served."""

    @property
    def rejected(self) -> bool:
        """Stored but not served (the store deletes it)."""
        return self in (ReadOutcome.CORRUPT, ReadOutcome.UNDECRYPTABLE)


def set_from_pages(
    conns: Connections, *, batch: list[tuple[bytes, BlockValue]], px: int | None
) -> list[ErrorReply | None]:
    """``SET name value [PX px]`` for each of ``batch``, pipelined on one connection.

    Returns, per value, ``None`` (stored) or the server's refusal (e.g. ``OOM``). The
    replies are first compared with as many ``+OK`` at once (one comparison for the
    batch); only a batch whose replies differ is parsed reply by reply.

    Raises:
        ConnectionError: a reply that is not ``+OK`` or an error, or a connection
            closed before every reply came (nothing is known stored).
        OSError: the socket failed or timed out.
    """
    if not batch:
        return []
    with conns.owned() as conn:
        send_buffers(conn.sock, set_commands(batch, px))
        reader = ReplyReader(conn.sock, _SET_READ_BYTES)
        # one wake-up under the mark, then the rest at the usual mark of one byte: a
        # second read under it would wait for bytes that may never come (a batch
        # whose replies outgrow the buffer, or an error reply that split them)
        with replies_awaited(conn.sock, min(len(_OK) * len(batch), _SET_READ_BYTES)):
            reader.fill()
        if reader.take_if(_OK * len(batch)):
            return [None] * len(batch)
        return [_set_reply(reader.line()) for _ in batch]


def set_commands(batch: list[tuple[bytes, BlockValue]], px: int | None) -> list[Any]:
    """The buffers of ``SET name value [PX px]`` for each of ``batch``, in RESP, no page
    copied: per value, one ``bytes`` (the end of the previous command, this command's
    head and the block header) and the page itself; then the last command's end.
    Formatted in one ``%`` per value: a generic per-argument packer cost 3x the CPU per
    value. Empty for an empty batch."""
    if not batch:
        return []
    end = b"\r\n"
    if px is not None:
        ms = b"%d" % px
        end += b"$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ms), ms)
    head = b"*%d\r\n$3\r\nSET\r\n" % (3 if px is None else 5)
    out: list[Any] = []
    before = b""
    for name, value in batch:
        size = len(value.header) + value.payload.nbytes
        out += [b"%s%s$%d\r\n%s\r\n$%d\r\n%s" % (before, head, len(name), name, size, value.header)]
        out.append(value.payload)
        before = end
    out.append(end)
    return out


_OK = b"+OK\r\n"
_SET_READ_BYTES = 4096


@contextlib.contextmanager
def replies_awaited(sock: Any, nbytes: int) -> Iterator[None]:
    """Wake the reader only once ``nbytes`` of replies are in (``SO_RCVLOWAT``).

    The server answers each ``SET`` of a batch as it stores it, so without this the
    reading thread woke (a ``poll``, a ``recv``, the GIL taken back) for every few
    ``+OK`` (``recv_into`` ran 2.6 times per batch of 8 in a profile). ``nbytes`` must
    not exceed the least a well-formed answer to the batch holds (``+OK\r\n`` per
    value; an error reply is longer); a malformed shorter one then waits out the
    socket timeout and fails as a lost connection, as it would have anyway. A closed
    connection wakes the reader at once. The mark goes back to 1 after, for the
    pool's other commands (a short reply under a raised mark would time out); if that
    fails the caller drops the connection. Plain TCP sockets only: TLS counts
    encrypted bytes, and Unix sockets were not measured. This needs the socket's
    timeout (CPython polls before each ``recv``): on a blocking socket without one a
    ``recv`` under a raised mark hung on Linux loopback in a test.

    Worth it at 256 KiB, 4 threads x 8 values: stores 1.23x, a quarter less client
    CPU per GB (``docs/decisions.md``).
    """
    if isinstance(sock, ssl.SSLSocket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        yield
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
    try:
        yield
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def _set_reply(line: bytes) -> ErrorReply | None:
    if line == _OK[:-2]:
        return None
    if line.startswith(b"-"):
        return ErrorReply(line[1:].decode(errors="replace"))
    raise ConnectionError(f"unexpected reply to SET: {line[:40]!r}")


def get_into_pages(
    conns: Connections, *, codec: BlockCodec, batch: list[tuple[bytes, bytes, np.ndarray]]
) -> list[ReadOutcome]:
    """``GET`` each of ``batch`` on one connection of ``conns``, each value read into its
    page; at most ``get_window`` requests outstanding (the next one sent as a reply is
    about to be read)."""
    if not batch:
        return []
    gets = [_GET % (len(name), name) for _, name, _ in batch]
    window = get_window(max(dest.nbytes for _, _, dest in batch))
    with conns.owned() as conn:
        sock = conn.sock
        sock.sendall(b"".join(gets[:window]))
        reader = ReplyReader(sock)
        outcomes = []
        for i, (key, _, dest) in enumerate(batch):
            if 0 < i <= len(batch) - window:  # the next request, as reply i is read
                sock.sendall(gets[i + window - 1])
            outcomes.append(receive(reader, codec, key, dest))
        return outcomes


_GET = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n"

WINDOW_BYTES = 512 << 10
"""Value bytes a load keeps requested ahead on one connection (at least one value)."""


def get_window(value_bytes: int) -> int:
    """``GET`` requests outstanding per connection for values of ``value_bytes``.

    Redis answers every ``GET`` it has read at once, copying each value into the
    connection's reply buffers, and writes them out as the socket takes them: a batch
    of 8 values of 256 KiB held 2 MiB per connection in the server's buffers, long out
    of its caches by the time they were written. With one or two requests outstanding
    the server's CPU per GB falls by a quarter (``docs/decisions.md``).
    """
    return max(1, WINDOW_BYTES // max(1, value_bytes))


def receive(reader: ReplyReader, codec: BlockCodec, key: bytes, dest: np.ndarray) -> ReadOutcome:
    """Read one GET reply and open it into ``dest`` (zeroed if it fails)."""
    line = reader.line()
    if line in (b"$-1", b"_"):  # nil in RESP2, null in RESP3
        dest[:] = 0
        return ReadOutcome.MISS
    if line.startswith(b"-"):  # an error reply: a foreign value (WRONGTYPE, ...)
        return reject(key, dest, line.decode(errors="replace"))
    if line.startswith(b"!"):  # a RESP3 blob error
        reader.skip(int(line[1:]) + 2)
        return reject(key, dest, "error reply")
    if not line.startswith(b"$"):
        raise ConnectionError(f"unexpected reply to GET: {line[:40]!r}")
    length = int(line[1:])
    size = length - dest.nbytes
    if size not in codec.header_sizes(len(key)):
        reader.skip(length + 2)
        expected = codec.header_size(len(key)) + dest.nbytes
        return reject(key, dest, f"value of {length} bytes, expected {expected}")
    header, crlf = bytearray(size), bytearray(2)
    stored = codec.landing(dest)
    reader.read_into(memoryview(header), stored[: dest.nbytes].data, memoryview(crlf))
    if crlf != b"\r\n":
        raise ConnectionError("a bulk reply not ended by CRLF")
    return opened(codec, key, header, stored, dest)


def opened(
    codec: BlockCodec, key: bytes, header: bytearray, stored: np.ndarray, dest: np.ndarray
) -> ReadOutcome:
    """Whether ``header`` and the payload read into ``stored`` (``codec.landing(dest)``)
    are block ``key`` of the codec's model: ``HIT`` with its bytes in ``dest``, or
    ``CORRUPT`` / ``UNDECRYPTABLE`` with ``dest`` zeroed."""
    try:
        codec.open(key, header, stored, dest)
    except IntegrityError as e:
        return reject(key, dest, str(e), undecryptable=e.reason == Corruption.UNDECRYPTABLE)
    return ReadOutcome.HIT


def accept(codec: BlockCodec, key: bytes, value: Any, dest: np.ndarray) -> ReadOutcome:
    """Open one fetched value into ``dest``."""
    if value is None:
        dest[:] = 0
        return ReadOutcome.MISS
    if isinstance(value, Exception):  # an error reply: a foreign value (WRONGTYPE, ...)
        return reject(key, dest, str(value))
    view = memoryview(value)
    size = len(view) - dest.nbytes
    if size not in codec.header_sizes(len(key)):
        expected = codec.header_size(len(key)) + dest.nbytes
        return reject(key, dest, f"value of {len(view)} bytes, expected {expected}")
    stored = codec.landing(dest)
    stored[: dest.nbytes] = np.frombuffer(view, dtype=np.uint8, offset=size)
    return opened(codec, key, bytearray(view[:size]), stored, dest)


def reject(key: bytes, dest: np.ndarray, why: str, *, undecryptable: bool = False) -> ReadOutcome:
    """Zero a value's page: ``CORRUPT`` (logged, each), or ``UNDECRYPTABLE`` (at debug
    level: the engine's failure log warns once per tier for them, as a key that does
    not match fails every read)."""
    dest[:] = 0
    if undecryptable:
        logger.debug("remote block %s does not open: %s", key.hex()[:16], why)
        return ReadOutcome.UNDECRYPTABLE
    logger.warning("remote block %s failed verification: %s", key.hex()[:16], why)
    return ReadOutcome.CORRUPT
