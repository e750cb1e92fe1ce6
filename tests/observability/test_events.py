"""KV events encode byte for byte as vLLM's do, and kvtier's events map onto them."""

from __future__ import annotations

import msgspec
import pytest

from kvtier.blocks import BlockHash, Medium
from kvtier.observability.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    external_hash,
    to_kv_events,
)
from kvtier.scheduler.protocol import OffloadingEvent

# Encoded by vLLM 0.33.0's own classes (vllm/distributed/kv_events.py: KVEventBatch of a
# BlockStored with two byte hashes on DISK, a BlockRemoved with an integer hash on
# REMOTE and an AllBlocksCleared, ts=1700000000.25, data_parallel_rank=0).
VLLM_PAYLOAD = bytes.fromhex(
    "93cb41d954fc4010000093de0009a474797065ab426c6f636b53746f726564ac626c6f636b5f6861"
    "73686573 92c4080001020304050607c40808090a0b0c0d0e0fb1706172656e745f626c6f636b5f68"
    "617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d6564"
    "69756da44449534ba96c6f72615f6e616d65c0a86c6f63616c697479a54c4f43414c84a474797065"
    "ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf0102030405060708a66d6564"
    "69756da652454d4f5445a86c6f63616c697479a652454d4f544581a474797065b0416c6c426c6f63"
    "6b73436c656172656400".replace(" ", "")
)


def _batch() -> KVEventBatch:
    return KVEventBatch(
        ts=1700000000.25,
        events=[
            BlockStored(
                block_hashes=[bytes(range(8)), bytes(range(8, 16))],
                parent_block_hash=None,
                token_ids=[],
                block_size=16,
                lora_id=None,
                medium="DISK",
                lora_name=None,
                locality="LOCAL",
            ),
            BlockRemoved(block_hashes=[0x0102030405060708], medium="REMOTE", locality="REMOTE"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def test_a_batch_encodes_to_exactly_the_bytes_vllm_sends() -> None:
    assert msgspec.msgpack.encode(_batch()) == VLLM_PAYLOAD


def test_vllm_bytes_decode_into_kvtier_classes() -> None:
    assert msgspec.msgpack.Decoder(KVEventBatch).decode(VLLM_PAYLOAD) == _batch()


def test_the_wire_shape_field_by_field() -> None:
    """An array batch; events are maps tagged ``type``, fields in vLLM's order,
    defaults left out."""
    ts, events, rank = msgspec.msgpack.decode(VLLM_PAYLOAD)
    assert (ts, rank) == (1700000000.25, 0)
    stored, removed, cleared = events
    assert list(stored) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
        "lora_id", "medium", "lora_name", "locality",
    ]  # fmt: skip
    assert stored["type"] == "BlockStored" and stored["block_size"] == 16
    assert list(removed) == ["type", "block_hashes", "medium", "locality"]
    assert cleared == {"type": "AllBlocksCleared"}
    no_rank = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[]))
    assert msgspec.msgpack.decode(no_rank) == [1.0, [], None]  # as vLLM's: nil, not left out


KEY_A = BlockHash(bytes.fromhex("aa" * 24 + "0102030405060708"))
KEY_B = BlockHash(bytes.fromhex("bb" * 24 + "ffffffffffffffff"))


def test_kvtier_events_map_one_to_one_with_medium_and_locality() -> None:
    events = [
        OffloadingEvent((KEY_A, KEY_B), 16, Medium.CPU, removed=False),
        OffloadingEvent((KEY_A,), 16, Medium.DISK, removed=False),
        OffloadingEvent((KEY_B,), 16, Medium.REMOTE, removed=False),
        OffloadingEvent((KEY_A,), 16, Medium.CPU, removed=True),
    ]
    assert to_kv_events(events) == [
        BlockStored([KEY_A, KEY_B], None, [], 16, None, "CPU", None, locality="LOCAL"),
        BlockStored([KEY_A], None, [], 16, None, "DISK", None, locality="LOCAL"),
        BlockStored([KEY_B], None, [], 16, None, "REMOTE", None, locality="REMOTE"),
        BlockRemoved([KEY_A], "CPU", locality="LOCAL"),
    ]


@pytest.mark.parametrize(
    ("key", "as_int"), [(KEY_A, 0x0102030405060708), (KEY_B, 2**64 - 1), (b"\x05", 5)]
)
def test_integer_hashes_are_the_low_64_bits_big_endian(key: bytes, as_int: int) -> None:
    assert external_hash(key) == key
    assert external_hash(key, int_hashes=True) == as_int
    (event,) = to_kv_events([OffloadingEvent((BlockHash(key),), 4, Medium.CPU, True)], True)
    assert event == BlockRemoved([as_int], "CPU", locality="LOCAL")
