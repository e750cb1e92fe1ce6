"""Sealed blocks against an oracle written from the format's documentation, and what a
seal binds: a block opens only as the block, model and format it was sealed as, with
a key of the file; anything else is ``undecryptable``, never bytes.

The oracle (``oracle_open`` / ``oracle_seal``) derives the subkey with RFC 5869 HKDF
over ``hmac`` and lays out the header and the associated data from the table in
``kvtier.media.sealed_format``'s docstring, sharing no code with ``sealing``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

import numpy as np
import pytest
import xxhash
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kvtier.errors import IntegrityError
from kvtier.key_file import EncryptionKey
from kvtier.media import block_format, sealing
from kvtier.media.block_codec import PlainCodec, codec_for
from kvtier.media.sealed_format import HEADER_BYTES, TAG_BYTES
from kvtier.media.sealing import SealedCodec

FP = b"\x5a" * 32
KEY = b"\x01" * 32
OLD, NEW = EncryptionKey.of(b"o" * 32), EncryptionKey.of(b"n" * 32)
N = 8192


def page(seed: int = 0, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()  # 32 bytes: one block


def oracle_aad(header: bytes, key: bytes, fp: bytes) -> bytes:
    return header[:56] + struct.pack("<H", len(key)) + key + struct.pack("<H", len(fp)) + fp


def oracle_open(secret: bytes, header: bytes, body: bytes, key: bytes, fp: bytes) -> bytes:
    assert header[:4] == b"KVTB" and header[4:6] == (3).to_bytes(2, "little")
    assert header[6] == 2 and header[7] == 1 and int.from_bytes(header[8:12], "little") == 80
    assert int.from_bytes(header[12:20], "little") == len(body)
    assert header[20:28] == hashlib.sha256(b"kvtier/key-id/v1" + secret).digest()[:8]
    assert xxhash.xxh3_64_intdigest(header[:72]) == int.from_bytes(header[72:80], "little")
    salt, nonce, tag = header[28:44], header[44:56], header[56:72]
    subkey = hkdf_sha256(secret, salt, b"kvtier/seal/v3" + fp)
    return AESGCM(subkey).decrypt(nonce, body + tag, oracle_aad(header, key, fp))


def oracle_seal(secret: bytes, payload: bytes, key: bytes, fp: bytes) -> tuple[bytes, bytes]:
    salt, nonce = os.urandom(16), os.urandom(12)
    key_id = hashlib.sha256(b"kvtier/key-id/v1" + secret).digest()[:8]
    head = struct.pack("<4sHBBIQ8s16s12s", b"KVTB", 3, 2, 1, 80, len(payload), key_id, salt,
                       nonce)  # fmt: skip
    subkey = hkdf_sha256(secret, salt, b"kvtier/seal/v3" + fp)
    sealed = AESGCM(subkey).encrypt(nonce, payload, oracle_aad(head, key, fp))
    body, tag = sealed[:-16], sealed[-16:]
    header = head + tag
    return header + struct.pack("<Q", xxhash.xxh3_64_intdigest(header)), body


def seal(
    codec: SealedCodec | PlainCodec, data: np.ndarray, key: bytes = KEY
) -> tuple[bytes, bytes]:
    header, body = codec.seal(key, data)
    return header, body.tobytes()


def open_(
    codec: SealedCodec | PlainCodec, header: bytes, body: bytes, key: bytes = KEY
) -> np.ndarray:
    dest = np.zeros(len(body), np.uint8)
    stored = codec.landing(dest)
    stored[: len(body)] = np.frombuffer(body, np.uint8)
    codec.open(key, header, stored, dest)
    return dest


def reason(codec: SealedCodec | PlainCodec, header: bytes, body: bytes, key: bytes = KEY) -> str:
    with pytest.raises(IntegrityError) as error:
        open_(codec, header, body, key)
    assert error.value.reason is not None
    return error.value.reason


def test_a_sealed_block_is_the_documented_format_and_opens_in_the_oracle() -> None:
    codec = SealedCodec(FP, [NEW])
    data = page()
    header, body = seal(codec, data)
    assert len(header) == HEADER_BYTES == 80 and len(body) == N
    assert body != data.tobytes()
    assert oracle_open(NEW.secret, header, body, KEY, FP) == data.tobytes()


def test_a_block_the_oracle_sealed_opens_in_the_codec() -> None:
    data = page(1)
    header, body = oracle_seal(NEW.secret, data.tobytes(), KEY, FP)
    assert np.array_equal(open_(SealedCodec(FP, [NEW]), header, body), data)


@pytest.mark.parametrize(
    ("what", "key", "fp"),
    [
        ("another block key", b"\x02" * 32, FP),
        ("another model", KEY, b"\x5b" * 32),
        ("a key of another length", KEY[:16], FP),
    ],
)
def test_a_block_opens_only_as_the_block_and_model_it_was_sealed_as(
    what: str, key: bytes, fp: bytes
) -> None:
    header, body = seal(SealedCodec(FP, [NEW]), page())
    assert reason(SealedCodec(fp, [NEW]), header, body, key) == "undecryptable", what
    assert np.array_equal(open_(SealedCodec(FP, [NEW]), header, body), page())


def test_every_write_draws_a_fresh_nonce() -> None:
    codec = SealedCodec(FP, [NEW])
    (h1, b1), (h2, b2) = seal(codec, page()), seal(codec, page())
    assert h1[44:56] != h2[44:56] and b1 != b2
    assert h1[28:44] == h2[28:44]  # one subkey salt per epoch


def test_a_new_salt_after_each_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sealing, "EPOCH_BLOCKS", 3)
    codec = SealedCodec(FP, [NEW])
    sealed = [seal(codec, page(i)) for i in range(7)]
    salts = [h[28:44] for h, _ in sealed]
    assert salts[0] == salts[1] == salts[2] != salts[3]
    assert salts[3] == salts[4] == salts[5] != salts[6]
    reader = SealedCodec(FP, [NEW])
    for i, (h, b) in enumerate(sealed):
        assert np.array_equal(open_(reader, h, b), page(i))


def test_another_key_or_one_the_file_no_longer_holds_is_undecryptable() -> None:
    header, body = seal(SealedCodec(FP, [OLD]), page())
    assert reason(SealedCodec(FP, [NEW]), header, body) == "undecryptable"
    with pytest.raises(IntegrityError, match=f"sealed with key {OLD.key_id.hex()}, which"):
        open_(SealedCodec(FP, [NEW]), header, body)


def test_rotation_the_first_key_seals_every_key_opens() -> None:
    old_block = seal(SealedCodec(FP, [OLD]), page(1))
    rotated = SealedCodec(FP, [NEW, OLD])
    new_block = seal(rotated, page(2))
    assert new_block[0][20:28] == NEW.key_id
    assert np.array_equal(open_(rotated, *old_block), page(1))
    assert np.array_equal(open_(rotated, *new_block), page(2))
    assert reason(SealedCodec(FP, [OLD]), *new_block) == "undecryptable"


@pytest.mark.parametrize(
    ("where", "offset"),
    [
        ("ciphertext", HEADER_BYTES + 100),
        ("last ciphertext byte", HEADER_BYTES + N - 1),
        ("tag", 60),
        ("nonce", 50),
        ("salt", 30),
        ("payload length", 12),
    ],
)
def test_a_flipped_bit_anywhere_is_undecryptable_even_with_the_header_checksum_fixed(
    where: str, offset: int
) -> None:
    """An attacker who can write the store recomputes the (unkeyed) header checksum."""
    header, body = seal(SealedCodec(FP, [NEW]), page())
    block = bytearray(header + body)
    block[offset] ^= 0x01
    fixed = bytes(block[:72]) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(block[:72])))
    got = reason(SealedCodec(FP, [NEW]), fixed, bytes(block[HEADER_BYTES:]))
    expected = "length_mismatch" if where == "payload length" else "undecryptable"
    assert got == expected, where


def test_a_damaged_header_is_corrupt_not_undecryptable() -> None:
    header, body = seal(SealedCodec(FP, [NEW]), page())
    damaged = bytearray(header)
    damaged[30] ^= 0x01  # the checksum is not fixed: a storage fault, not a forgery
    assert reason(SealedCodec(FP, [NEW]), bytes(damaged), body) == "header_checksum_mismatch"
    assert reason(SealedCodec(FP, [NEW]), b"XXXX" + header[4:], body) == "bad_magic"
    assert reason(SealedCodec(FP, [NEW]), header[:40], body) == "truncated"


@pytest.mark.parametrize(
    ("version", "with_key", "without_key"),
    [(2, "undecryptable", "header_checksum_mismatch"), (4, "wrong_version", "wrong_version")],
)
def test_a_sealed_block_relabelled_as_another_version_never_opens(
    version: int, with_key: str, without_key: str
) -> None:
    """A tier with a key reads version 3 only, a tier without one version 2 only: a
    sealed block relabelled (its header checksum fixed) is refused by both."""
    header, body = seal(SealedCodec(FP, [NEW]), page())
    relabelled = bytearray(header)
    relabelled[4:6] = version.to_bytes(2, "little")
    relabelled[72:80] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(relabelled[:72])))
    assert reason(SealedCodec(FP, [NEW]), bytes(relabelled), body) == with_key
    assert reason(PlainCodec(FP), bytes(relabelled), body) == without_key


def test_a_tier_without_a_key_never_serves_a_sealed_block() -> None:
    header, body = seal(SealedCodec(FP, [NEW]), page())
    with pytest.raises(IntegrityError, match="a sealed block, and this tier has no") as error:
        open_(PlainCodec(FP), header, body)
    assert error.value.reason == "undecryptable"


def test_a_tier_with_a_key_never_accepts_a_plaintext_block() -> None:
    """A plaintext block verifies for anyone who can write the store (its checksum is
    no secret): a tier with a key refuses it, however good its checksum."""
    plain = PlainCodec(FP)
    header, body = seal(plain, page())
    assert np.array_equal(open_(plain, header, body), page())
    with pytest.raises(IntegrityError, match="a plaintext block, and this tier reads only") as e:
        open_(SealedCodec(FP, [NEW]), header, body)
    assert e.value.reason == "undecryptable"


def test_the_two_formats_header_sizes_let_a_reader_take_either_whole() -> None:
    plain, sealed = PlainCodec(FP), SealedCodec(FP, [NEW])
    assert plain.header_sizes(32) == (block_format.header_size(32, 32), HEADER_BYTES)
    assert sealed.header_sizes(32) == (HEADER_BYTES, block_format.header_size(32, 32))
    assert sealed.landing(np.zeros(N, np.uint8)).nbytes == N + TAG_BYTES


def test_codec_for_chooses_by_the_keys() -> None:
    assert isinstance(codec_for(FP), PlainCodec)
    sealed = codec_for(FP, [NEW, OLD])
    assert isinstance(sealed, SealedCodec) and sealed.sealed


def test_seal_into_a_callers_buffer_leaves_the_page_as_it_was() -> None:
    codec = SealedCodec(FP, [NEW])
    data, out = page(), np.zeros(N + TAG_BYTES + 100, np.uint8)
    before = data.copy()
    header, body = codec.seal(KEY, data, out)
    assert np.shares_memory(body, out) and np.array_equal(data, before)
    assert oracle_open(NEW.secret, header, body.tobytes(), KEY, FP) == before.tobytes()
