"""Block-format details that the round-trip and bit-flip tests do not pin: a given
checksum is used as given, a zero-length name is rejected even when the other is not,
and every error says what is wrong (written to kill mutants that survived
``scripts/mutate.sh``)."""

from __future__ import annotations

import struct

import pytest
import xxhash

from kvtier.errors import IntegrityError
from kvtier.media import block_format as bf
from kvtier.media.block_format import Corruption

KEY, FP, PAYLOAD = b"k" * 32, b"f" * 32, b"payload bytes"


def test_a_given_checksum_is_written_as_given() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD, checksum=0x12345678)
    assert bf.decode_header(header).payload_checksum == 0x12345678
    with pytest.raises(IntegrityError) as err:
        bf.verify(header, PAYLOAD, key=KEY, fingerprint=FP)
    assert err.value.reason == Corruption.CHECKSUM_MISMATCH
    assert "payload bytes do not match their XXH3-64" in str(err.value)


@pytest.mark.parametrize(("key", "fp", "name"), [(b"", FP, "key"), (KEY, b"", "fingerprint")])
def test_empty_names_are_refused_by_name(key: bytes, fp: bytes, name: str) -> None:
    with pytest.raises(ValueError, match=f"block {name} must be 1..255 bytes, got 0"):
        bf.encode_header(key, fp, PAYLOAD)


def _with_key_length(header: bytes, klen: int, flen: int) -> bytes:
    """The header with its name lengths rewritten and its checksum made right again."""
    body = bytearray(header[:-8])
    struct.pack_into("<HH", body, 12, klen, flen)
    return bytes(body) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(body)))


def test_a_zero_key_length_is_corrupt_even_with_a_fingerprint() -> None:
    header = bf.encode_header(b"k", b"ff", PAYLOAD)
    forged = _with_key_length(header, 0, 3)  # same total, lengths moved
    with pytest.raises(IntegrityError) as err:
        bf.decode_header(forged)
    assert err.value.reason == Corruption.HEADER_CHECKSUM_MISMATCH
    assert "inconsistent header length" in str(err.value)


def test_error_messages_say_what_is_wrong() -> None:
    header = bf.encode_header(KEY, FP, PAYLOAD)
    cases = [
        (lambda: bf.decode_header(header[:10]), "10 bytes hold no 32-byte header"),
        (lambda: bf.decode_header(b"XXXX" + header[4:]), "magic b'XXXX'"),
        (lambda: bf.decode_header(header[:40]), "40 bytes hold no"),
        (
            lambda: bf.verify(header, PAYLOAD, key=b"o" * 32, fingerprint=FP),
            f"header names {KEY.hex()}, asked {(b'o' * 32).hex()}",
        ),
        (
            lambda: bf.verify(header, PAYLOAD, key=KEY, fingerprint=b"g" * 32),
            f"stored for model {FP.hex()[:16]}, this model is {(b'g' * 32).hex()[:16]}",
        ),
        (
            lambda: bf.verify(header, PAYLOAD + b"!", key=KEY, fingerprint=FP),
            f"payload is {len(PAYLOAD) + 1} bytes, header says {len(PAYLOAD)}",
        ),
    ]
    for call, words in cases:
        with pytest.raises(IntegrityError) as err:
            call()
        assert words in str(err.value)
    flipped = bytearray(header)
    flipped[20] ^= 1
    with pytest.raises(IntegrityError, match="header bytes do not match their checksum"):
        bf.decode_header(bytes(flipped))
    assert bf.decode_header(header).version == bf.FORMAT_VERSION
