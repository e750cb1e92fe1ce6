"""The header of a sealed block (format version 3), and what its seal authenticates.

Runs on the worker side, in whichever thread stores or loads a block; pure Python over
``struct`` and ``xxhash``. The cipher itself is ``sealing``'s; this module only lays
out bytes.

A sealed block is ``header || ciphertext``: the ciphertext is the payload under
AES-256-GCM, as long as the payload, and its 16-byte tag is in the header.
Little-endian, byte by byte::

    offset size  field
         0    4  magic             b"KVTB"
         4    2  format version    u16 = 3
         6    1  checksum algo     u8  = 2 (XXH3-64 of the header, seed 0)
         7    1  cipher            u8  = 1 (AES-256-GCM, HKDF-SHA256 subkeys)
         8    4  header length     u32 = 80
        12    8  payload length    u64
        20    8  key id            the id of the key that sealed it (``key_file``)
        28   16  subkey salt       which subkey of that key (``sealing``)
        44   12  nonce             random, fresh for every write
        56   16  tag               the GCM tag
        72    8  header checksum   u64 XXH3-64 of bytes 0 .. 72

The header names neither the block nor the model: the *associated data* of the seal
does, and it is built by the reader from what it asked for, not from stored bytes::

    aad = header bytes 0 .. 56 (magic .. nonce: format version, cipher, payload
          length, key id, salt and nonce) || u16 len || block key
          || u16 len || storage fingerprint digest

so a block opens only as the block it was sealed as, for the model it was sealed for,
in the format it was sealed in: moved to another key (a disk slot, a Redis value
renamed), another model's directory or prefix, or relabelled with another version,
its tag fails. The header checksum is not a defence (anyone who can write the store
can recompute it); it tells a torn or damaged header (``corrupt``) from a seal that
does not open (``undecryptable``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from kvtier.media.block_format import (
    CHECKSUM_XXH3_64,
    MAGIC,
    SEALED_VERSION,
    BytesLike,
    Corruption,
    corruption,
)

CIPHER_AES_256_GCM = 1
KEY_ID_BYTES = 8
SALT_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16

_FIXED = struct.Struct("<4sHBBIQ8s16s12s16s")
_SUM = struct.Struct("<Q")
HEADER_BYTES = _FIXED.size + _SUM.size  # 80
_AAD_END = _FIXED.size - TAG_BYTES  # 56: everything before the tag
_NAMES = struct.Struct("<H")


@dataclass(frozen=True, slots=True)
class SealedHeader:
    """A decoded sealed header (already checked against its own checksum)."""

    payload_length: int
    key_id: bytes
    salt: bytes
    nonce: bytes
    tag: bytes

    def associated_data(self, key: bytes, fingerprint: bytes) -> bytes:
        """What the seal of this block authenticates, for block ``key`` of model
        ``fingerprint`` (see the module docstring)."""
        return associated_data(
            self.payload_length, self.key_id, self.salt, self.nonce, key, fingerprint
        )


def associated_data(
    payload_length: int, key_id: bytes, salt: bytes, nonce: bytes, key: bytes, fingerprint: bytes
) -> bytes:
    """The associated data of a block sealed with these values (module docstring)."""
    head = _FIXED.pack(
        MAGIC,
        SEALED_VERSION,
        CHECKSUM_XXH3_64,
        CIPHER_AES_256_GCM,
        HEADER_BYTES,
        payload_length,
        key_id,
        salt,
        nonce,
        bytes(TAG_BYTES),
    )[:_AAD_END]
    return b"".join((head, _NAMES.pack(len(key)), key, _NAMES.pack(len(fingerprint)), fingerprint))


def encode_sealed_header(header: SealedHeader) -> bytes:
    """The bytes of ``header`` (``HEADER_BYTES`` long)."""
    body = _FIXED.pack(
        MAGIC,
        SEALED_VERSION,
        CHECKSUM_XXH3_64,
        CIPHER_AES_256_GCM,
        HEADER_BYTES,
        header.payload_length,
        header.key_id,
        header.salt,
        header.nonce,
        header.tag,
    )
    return body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def decode_sealed_header(data: BytesLike) -> SealedHeader:
    """Decode and self-check the sealed header at the start of ``data``.

    Raises:
        IntegrityError: reason ``truncated``, ``bad_magic``, ``wrong_version`` or
            ``header_checksum_mismatch``.
    """
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise corruption(
            Corruption.TRUNCATED, f"{len(view)} bytes hold no {HEADER_BYTES}-byte sealed header"
        )
    magic, version, algo, cipher, size, length, key_id, salt, nonce, tag = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise corruption(Corruption.BAD_MAGIC, f"magic {bytes(magic)!r}, expected {MAGIC!r}")
    if (version, algo, cipher) != (SEALED_VERSION, CHECKSUM_XXH3_64, CIPHER_AES_256_GCM):
        raise corruption(
            Corruption.WRONG_VERSION,
            f"format {version} checksum {algo} cipher {cipher}, this build reads sealed "
            f"blocks of {SEALED_VERSION}/{CHECKSUM_XXH3_64}/{CIPHER_AES_256_GCM}",
        )
    (stored,) = _SUM.unpack_from(view, _FIXED.size)
    if size != HEADER_BYTES or xxhash.xxh3_64_intdigest(view[: _FIXED.size]) != stored:
        raise corruption(
            Corruption.HEADER_CHECKSUM_MISMATCH, "sealed header bytes do not match their checksum"
        )
    return SealedHeader(length, bytes(key_id), bytes(salt), bytes(nonce), bytes(tag))
