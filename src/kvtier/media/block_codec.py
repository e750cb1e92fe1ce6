"""How a store turns a page into the bytes it keeps, and those bytes back into a page.

Runs on the worker side, in the I/O threads of the disk and remote stores; no torch.
A store holds one ``BlockCodec``, chosen once from its configuration by ``codec_for``:

* ``PlainCodec`` (no ``encryption_key_file``): ``header || payload`` in the verified
  format of ``block_format`` (version 2), the payload as it was;
* ``SealedCodec`` (``kvtier.media.sealing``): ``header || ciphertext``, AES-256-GCM,
  version 3 (``sealed_format``).

Each reads only its own format and fails the other with ``undecryptable``, by the
version in the header: a tier without a key never serves a sealed block's bytes, a
tier with one never accepts a plaintext block (which anyone who can write the store
could have planted). Both formats keep the payload's length, so a disk slot or a
Redis value has room for either.

The protocol, as a store uses it::

    header, body = codec.seal(key, page)       # write header, then body
    stored = codec.landing(dest)                # read the payload into stored[:n]
    codec.open(key, header, stored, dest)       # verified (and decrypted) into dest
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kvtier.key_file import EncryptionKey
from kvtier.media import block_format, sealed_format
from kvtier.media.block_format import BytesLike, Corruption


class BlockCodec(Protocol):
    """What a store needs to write and read its blocks (thread-safe).

    Attributes:
        fingerprint: the storage fingerprint digest every block is bound to.
        sealed: whether blocks are sealed (an ``encryption_key_file`` is set).
    """

    fingerprint: bytes
    sealed: bool

    def header_size(self, key_length: int) -> int:
        """Bytes of the header this codec writes for a key of ``key_length`` bytes."""
        ...

    def header_sizes(self, key_length: int) -> tuple[int, int]:
        """The header sizes a stored value may have: this codec's, then the other
        format's (read whole, so that its header says why it does not open)."""
        ...

    def seal(
        self, key: bytes, page: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[bytes, np.ndarray]:
        """``(header, body)`` to store for ``page`` (a flat ``uint8`` array) as block
        ``key``. ``body`` is ``page`` itself, or (sealed) its ciphertext in ``out``
        (``sealing_bytes(page.nbytes)`` bytes, or a new array when ``None``)."""
        ...

    def landing(self, dest: np.ndarray) -> np.ndarray:
        """Where the stored payload of a block for ``dest`` is read to (into its first
        ``dest.nbytes`` bytes): ``dest`` itself, or (sealed) a new buffer."""
        ...

    def open(self, key: bytes, header: BytesLike, stored: np.ndarray, dest: np.ndarray) -> None:
        """Check that ``header`` and the payload read into ``stored`` (from
        ``landing(dest)``) are block ``key`` of this model; leave its bytes in ``dest``.

        Raises:
            IntegrityError: with one ``Corruption`` reason (``undecryptable`` for a
                block of the other format or a seal that does not open); ``dest``
                may then hold anything: the caller zeroes it.
        """
        ...


def sealing_bytes(payload_bytes: int) -> int:
    """Bytes of the ``out`` buffer ``SealedCodec.seal`` needs for a payload."""
    return payload_bytes + sealed_format.TAG_BYTES


class PlainCodec:
    """Blocks in the verified plaintext format (``block_format``, version 2)."""

    sealed = False

    def __init__(self, fingerprint: bytes) -> None:
        self.fingerprint = fingerprint

    def header_size(self, key_length: int) -> int:
        return block_format.header_size(key_length, len(self.fingerprint))

    def header_sizes(self, key_length: int) -> tuple[int, int]:
        return self.header_size(key_length), sealed_format.HEADER_BYTES

    def seal(
        self, key: bytes, page: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[bytes, np.ndarray]:
        return block_format.encode_header(key, self.fingerprint, page.data), page

    def landing(self, dest: np.ndarray) -> np.ndarray:
        return dest

    def open(self, key: bytes, header: BytesLike, stored: np.ndarray, dest: np.ndarray) -> None:
        if block_format.stored_version(header) == block_format.SEALED_VERSION:
            raise block_format.corruption(
                Corruption.UNDECRYPTABLE,
                "a sealed block, and this tier has no encryption_key_file to open it",
            )
        payload = stored[: dest.nbytes]  # ``landing``: the page itself, read in place
        # The header kvtier writes for these payload bytes under this key and model: a
        # stored header equal to it byte for byte is verified (magic, version, lengths,
        # key, fingerprint, payload checksum and its own checksum all match) without
        # decoding it; any other is decoded and checked field by field for the reason.
        expected = block_format.encode_header(key, self.fingerprint, payload.data)
        if bytes(memoryview(header).cast("B")[: len(expected)]) != expected:
            block_format.verify(header, payload.data, key=key, fingerprint=self.fingerprint)


def codec_for(fingerprint: bytes, keys: Sequence[EncryptionKey] = ()) -> BlockCodec:
    """The codec of a store for model ``fingerprint``: sealed with ``keys`` (the first
    seals, every one opens), plaintext without."""
    if not keys:
        return PlainCodec(fingerprint)
    from kvtier.media.sealing import SealedCodec

    return SealedCodec(fingerprint, keys)
