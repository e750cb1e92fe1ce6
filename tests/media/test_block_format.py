"""The block header: round trip, and one precise reason for each kind of corruption."""

from __future__ import annotations

import struct
import zlib

import pytest
import xxhash

from kvtier.errors import IntegrityError
from kvtier.media import block_format as bf
from kvtier.media.block_format import Corruption

KEY = bytes(range(32))
FP = b"\xfe" * 32
PAYLOAD = bytes(range(256)) * 16


def reason(header: bytes, payload: bytes = PAYLOAD, key: bytes = KEY, fp: bytes = FP) -> str:
    with pytest.raises(IntegrityError) as info:
        bf.verify(header, payload, key=key, fingerprint=fp)
    assert info.value.reason is not None
    assert str(info.value).startswith(info.value.reason)
    return info.value.reason


def test_round_trip() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    assert len(header) == bf.header_size(32, 32) == 104
    got = bf.verify(header + b"\0" * 50, PAYLOAD, key=KEY, fingerprint=FP)
    assert got == bf.BlockHeader(KEY, FP, len(PAYLOAD), xxhash.xxh3_64_intdigest(PAYLOAD))
    assert got.size == len(header)


def test_layout_byte_by_byte() -> None:
    """The documented layout (docs/disk.md), so that another reader can be written."""
    key, fp = b"k" * 5, b"f" * 3
    h = bf.encode_header(key, fp, b"abc")
    assert h[:4] == b"KVTB"
    abc = xxhash.xxh3_64_intdigest(b"abc")
    assert struct.unpack_from("<HBBIHHQQ", h, 4) == (2, 2, 0, 48, 5, 3, 3, abc)
    assert h[32:37] == key and h[37:40] == fp
    assert struct.unpack_from("<Q", h, 40)[0] == xxhash.xxh3_64_intdigest(h[:40])
    assert len(h) == 48


def version_1_header(key: bytes, fp: bytes, payload: bytes) -> bytes:
    """A header as the previous format (version 1, zlib CRC-32) wrote it, built by hand."""
    body = (
        struct.pack(
            "<4sHBBIHHQII",
            b"KVTB",
            1,
            1,
            0,
            36 + len(key) + len(fp),
            len(key),
            len(fp),
            len(payload),
            zlib.crc32(payload),
            0,
        )
        + key
        + fp
    )
    return body + struct.pack("<I", zlib.crc32(body))


def test_version_1_blocks_are_refused_as_wrong_version() -> None:
    """Blocks written before the XXH3 format are misses, never misread."""
    assert reason(version_1_header(KEY, FP, PAYLOAD)) == Corruption.WRONG_VERSION


def test_variable_length_keys_and_limits() -> None:
    for key in (b"x", b"y" * 255):
        assert bf.decode_header(bf.encode_header(key, FP, b"")).key == key
    for bad in (b"", b"z" * 256):
        with pytest.raises(ValueError):
            bf.encode_header(bad, FP, b"")
        with pytest.raises(ValueError):
            bf.encode_header(KEY, bad, b"")


def test_flipped_payload_byte() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    bad = bytearray(PAYLOAD)
    bad[1234] ^= 0x10
    assert reason(header, bytes(bad)) == Corruption.CHECKSUM_MISMATCH


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0, Corruption.BAD_MAGIC),
        (4, Corruption.WRONG_VERSION),
        (6, Corruption.WRONG_VERSION),  # the checksum algorithm byte
        (16, Corruption.HEADER_CHECKSUM_MISMATCH),  # payload length
        (24, Corruption.HEADER_CHECKSUM_MISMATCH),  # payload checksum
        (40, Corruption.HEADER_CHECKSUM_MISMATCH),  # inside the key
        (80, Corruption.HEADER_CHECKSUM_MISMATCH),  # inside the fingerprint
        (28, Corruption.HEADER_CHECKSUM_MISMATCH),  # payload checksum, high half
        (97, Corruption.HEADER_CHECKSUM_MISMATCH),  # the header checksum itself
        (103, Corruption.HEADER_CHECKSUM_MISMATCH),  # its last byte
        (8, Corruption.HEADER_CHECKSUM_MISMATCH),  # header length
    ],
)
def test_flipped_header_byte(offset: int, expected: Corruption) -> None:
    header = bytearray(bf.encode_header(KEY, FP, PAYLOAD))
    header[offset] ^= 0x01
    assert reason(bytes(header)) == expected


def test_every_single_bit_flip_of_the_header_is_caught() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    for i in range(len(header) * 8):
        bad = bytearray(header)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(IntegrityError):
            bf.verify(bytes(bad), PAYLOAD, key=KEY, fingerprint=FP)


def test_truncated_header() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    for n in (0, 10, 31, 32, 103):
        assert reason(header[:n]) == Corruption.TRUNCATED


def test_key_fingerprint_and_length_mismatch() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    assert reason(header, key=b"other key") == Corruption.KEY_MISMATCH
    assert reason(header, fp=b"\x00" * 32) == Corruption.FINGERPRINT_MISMATCH
    assert reason(header, PAYLOAD[:-1]) == Corruption.LENGTH_MISMATCH
    assert reason(header, PAYLOAD + b"\0") == Corruption.LENGTH_MISMATCH


def test_stored_version_reads_the_version_field_and_nothing_else() -> None:
    header = bf.encode_header(b"k", b"f", b"payload")
    assert bf.stored_version(header) == 2
    assert bf.stored_version(bytearray(header[:6])) == 2  # magic and version suffice
    assert bf.stored_version(b"KVTB" + (3).to_bytes(2, "little")) == 3
    assert bf.stored_version(b"KVTB" + (0x0102).to_bytes(2, "little")) == 0x0102  # little-endian
    assert bf.stored_version(header[:5]) is None  # too short for the field
    assert bf.stored_version(b"KVTX" + header[4:]) is None  # another magic
    assert bf.stored_version(b"") is None
