"""Sealed blocks: AES-256-GCM over each payload, bound to its block key, model and format.

Runs on the worker side, in the I/O threads of the disk and remote stores (thread-safe;
``cryptography`` releases the GIL while it encrypts); no torch. ``SealedCodec`` is the
``BlockCodec`` of a tier with an ``encryption_key_file``.

Keys. A key of the file never touches a block itself: each block is sealed with a
*subkey*, ``HKDF-SHA256(key, salt, info = "kvtier/seal/v3" || fingerprint)``. The
fingerprint makes the subkeys of two models (or two ranks of one) distinct, and the
salt, 16 random bytes, is drawn afresh each time a codec is made (a store opening) and
after every ``EPOCH_BLOCKS`` blocks it seals. Each block's header names the key (its
id) and the salt, so a reader derives the same subkey (cached), with whichever of its
keys sealed the block.

Why the salt: every seal takes a fresh random 96-bit nonce, and GCM stays safe only
while no nonce repeats under one key -- about 2**32 seals of random nonces. A tier
writing 20,000 blocks a second reaches that in under three days; the salt caps every
subkey at ``EPOCH_BLOCKS`` seals (a repeat then has a chance of ~2**-49), however long
the engine runs and however many engines share the key file.

What a seal binds (``sealed_format.associated_data``): the header's format version,
cipher, payload length, key id, salt and nonce, the block key and the storage
fingerprint, the last two as the *reader* asks for them. A block opens only as the
block it was sealed as; anything else -- another key, a value moved or renamed,
another model's, a flipped bit anywhere -- fails its tag and is ``undecryptable``.

Tenants: the block key commits to the request's cache salt (``kvtier.keys``), so one
tenant's block never opens as another's. The subkeys are per model, not per tenant:
the stores see block keys, never the salt they were hashed with (``docs/security.md``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kvtier.key_file import EncryptionKey
from kvtier.media import block_format, sealed_format
from kvtier.media.block_format import BytesLike, Corruption, corruption
from kvtier.media.forks import renew_after_fork
from kvtier.media.sealed_format import (
    NONCE_BYTES,
    SALT_BYTES,
    TAG_BYTES,
    SealedHeader,
    associated_data,
    decode_sealed_header,
    encode_sealed_header,
)

EPOCH_BLOCKS = 1 << 24
"""Blocks one subkey seals before the codec draws a new salt."""
SUBKEYS_KEPT = 1024
"""Subkeys a codec keeps derived for reading (one per key and salt met)."""
_INFO = b"kvtier/seal/v3"


def derive_subkey(key: EncryptionKey, salt: bytes, fingerprint: bytes) -> AESGCM:
    """The AEAD of ``key``'s subkey for ``salt`` and model ``fingerprint``."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_INFO + fingerprint)
    return AESGCM(hkdf.derive(key.secret))


class SealedCodec:
    """Blocks sealed with AES-256-GCM (``sealed_format``, version 3). See the module
    docstring; ``BlockCodec`` for the protocol.

    Args:
        fingerprint: the storage fingerprint digest of the store's model.
        keys: the keys of ``encryption_key_file``; the first seals, every one opens.
    """

    sealed = True

    def __init__(self, fingerprint: bytes, keys: Sequence[EncryptionKey]) -> None:
        if not keys:
            raise ValueError("a sealed codec needs at least one key")
        self.fingerprint = fingerprint
        self._writer = keys[0]
        self._keys = {k.key_id: k for k in keys}
        self._lock = threading.Lock()
        self._subkeys: dict[tuple[bytes, bytes], AESGCM] = {}
        self._salt = b""
        self._aead: AESGCM | None = None
        self._left = 0  # seals left under the current salt
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent's thread may have held it) and a
        fresh salt (the child's nonces are its own random draws either way)."""
        self._lock = threading.Lock()
        self._left = 0

    # -- BlockCodec ------------------------------------------------------------------

    def header_size(self, key_length: int) -> int:
        return sealed_format.HEADER_BYTES

    def header_sizes(self, key_length: int) -> tuple[int, int]:
        return (
            sealed_format.HEADER_BYTES,
            block_format.header_size(key_length, len(self.fingerprint)),
        )

    def seal(
        self, key: bytes, page: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[bytes, np.ndarray]:
        n = page.nbytes
        buf = np.empty(n + TAG_BYTES, np.uint8) if out is None else out[: n + TAG_BYTES]
        salt, aead = self._sealing()
        nonce = os.urandom(NONCE_BYTES)
        key_id = self._writer.key_id
        aad = associated_data(n, key_id, salt, nonce, key, self.fingerprint)
        aead.encrypt_into(nonce, page.data, aad, buf.data)
        tag = bytes(buf[n:])
        return encode_sealed_header(SealedHeader(n, key_id, salt, nonce, tag)), buf[:n]

    def landing(self, dest: np.ndarray) -> np.ndarray:
        return np.empty(dest.nbytes + TAG_BYTES, np.uint8)

    def open(self, key: bytes, header: BytesLike, stored: np.ndarray, dest: np.ndarray) -> None:
        if block_format.stored_version(header) == block_format.FORMAT_VERSION:
            raise corruption(
                Corruption.UNDECRYPTABLE,
                "a plaintext block, and this tier reads only sealed blocks "
                "(encryption_key_file is set)",
            )
        h = decode_sealed_header(header)
        n = dest.nbytes
        if h.payload_length != n:
            raise corruption(
                Corruption.LENGTH_MISMATCH, f"sealed {h.payload_length} bytes, {n} asked"
            )
        aead = self._opening(h.key_id, h.salt)
        if aead is None:
            raise corruption(
                Corruption.UNDECRYPTABLE,
                f"sealed with key {h.key_id.hex()}, which encryption_key_file does not hold",
            )
        stored[n : n + TAG_BYTES] = np.frombuffer(h.tag, np.uint8)
        try:
            aad = h.associated_data(key, self.fingerprint)
            aead.decrypt_into(h.nonce, stored[: n + TAG_BYTES].data, aad, dest.data)
        except InvalidTag:
            raise corruption(
                Corruption.UNDECRYPTABLE,
                f"does not open with key {h.key_id.hex()} as block {key.hex()[:16]} of this "
                "model (moved, forged or damaged)",
            ) from None

    # -- subkeys ---------------------------------------------------------------------

    def _sealing(self) -> tuple[bytes, AESGCM]:
        """The salt and AEAD for the next seal (a new salt every ``EPOCH_BLOCKS``)."""
        with self._lock:
            if self._left <= 0 or self._aead is None:
                self._salt = os.urandom(SALT_BYTES)
                self._aead = derive_subkey(self._writer, self._salt, self.fingerprint)
                self._left = EPOCH_BLOCKS
            self._left -= 1
            return self._salt, self._aead

    def _opening(self, key_id: bytes, salt: bytes) -> AESGCM | None:
        """The AEAD of the subkey that sealed a block, or ``None`` if its key is not
        one of this codec's."""
        with self._lock:
            aead = self._subkeys.get((key_id, salt))
        if aead is not None:
            return aead
        key = self._keys.get(key_id)
        if key is None:
            return None
        aead = derive_subkey(key, salt, self.fingerprint)  # outside the lock: ~10 us
        with self._lock:
            if len(self._subkeys) >= SUBKEYS_KEPT:
                del self._subkeys[next(iter(self._subkeys))]  # the oldest derived
            self._subkeys[(key_id, salt)] = aead
        return aead
