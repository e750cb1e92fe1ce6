"""Block keys: format v2 is stable, chained, and separates models, weights and tenants."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import subprocess
import sys

import pytest

from kvtier.errors import ConfigError
from kvtier.keys import BlockHasher, ModelFingerprint, block_key, engine_key, root_key

WEIGHTS = "ab" * 32
FP = ModelFingerprint(
    model_id="test-model", dtype="float16", kv_layout="L2xH2xD16", block_size=4, weights=WEIGHTS
)

# Golden values of format v2. If this test fails, the key format changed: that is a
# new format version (docs/keys.md), never a silent edit.
GOLDEN_ROOT = "3a3bf21b7a66c4e56ee56d608519b2ce8eb398db97dbb2e2311d9c27923782ff"
GOLDEN_KEYS = [
    "1e57fd7e7293d52d913c4428aee67b18e69f2df24417ad46c1c867153eda6bf0",
    "417f12a850fbaaca897332a56257d5bbe5a93a5483ef4a34165385bd4924daee",
]


def test_golden_values_of_format_v2() -> None:
    hasher = BlockHasher(FP)
    assert hasher.root.hex() == GOLDEN_ROOT
    assert [k.hex() for k in hasher.hash_prompt(list(range(10)))] == GOLDEN_KEYS


def test_code_matches_the_documented_byte_layout() -> None:
    # docs/keys.md, written out by hand with hashlib and struct.
    def lp(b: bytes) -> bytes:
        return struct.pack("<I", len(b)) + b

    fingerprint = (
        b'{"block_size":4,"dtype":"float16","extra":[],"kv_layout":"L2xH2xD16",'
        b'"model_id":"test-model","parallel":"tp1/rank0","weights":"' + WEIGHTS.encode() + b'"}'
    )
    root = hashlib.sha256(b"kvtier/root/v2" + lp(b"sha256") + lp(fingerprint)).digest()
    tokens = struct.pack("<4I", 0, 1, 2, 3)
    no_extras = struct.pack("<I", 0)
    first = hashlib.sha256(b"kvtier/block/v2" + lp(root) + lp(tokens) + no_extras).digest()
    salted_extras = struct.pack("<I", 1) + lp(b"s" + b"tenant")
    salted = hashlib.sha256(b"kvtier/block/v2" + lp(root) + lp(tokens) + salted_extras).digest()
    hasher = BlockHasher(FP)
    assert hasher.root == root
    assert hasher.hash_prompt([0, 1, 2, 3])[0] == first
    assert hasher.hash_prompt([0, 1, 2, 3], cache_salt="tenant")[0] == salted


def test_keys_are_stable_across_processes() -> None:
    code = (
        "from kvtier.keys import BlockHasher, ModelFingerprint;"
        f"fp = ModelFingerprint('test-model', 'float16', 'L2xH2xD16', 4, weights='{WEIGHTS}');"
        "print(BlockHasher(fp).hash_prompt(list(range(10)))[-1].hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)},
    )
    assert out.stdout.strip() == BlockHasher(FP).hash_prompt(list(range(10)))[-1].hex()


def test_only_full_blocks_get_keys_and_each_commits_to_its_prefix() -> None:
    hasher = BlockHasher(FP)
    assert len(hasher.hash_prompt(list(range(11)))) == 2
    a = hasher.hash_prompt([1, 2, 3, 4, 5, 6, 7, 8])
    b = hasher.hash_prompt([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[0] != b[0] and a[1] != b[1], "the second block commits to the first"
    assert all(len(key) == 32 for key in a)


def test_chain_can_be_extended_from_a_parent() -> None:
    hasher = BlockHasher(FP)
    tokens = list(range(12))
    full = hasher.hash_prompt(tokens)
    head = hasher.hash_prompt(tokens[:4])
    tail = hasher.hash_prompt(tokens[4:], parent=head[-1], start_block=1)
    assert head + tail == full


def test_models_tenants_and_adapters_never_share_keys() -> None:
    tokens = list(range(8))
    base = BlockHasher(FP).hash_prompt(tokens)
    other_dtype = dataclasses.replace(FP, dtype="bfloat16")
    other_rank = dataclasses.replace(FP, parallel="tp2/rank1")
    other_size = dataclasses.replace(FP, parallel="tp2/rank0")
    other_weights = dataclasses.replace(FP, weights="cd" * 32)
    other_layout = dataclasses.replace(FP, kv_layout="L2xH1xD32")
    other_block = dataclasses.replace(FP, block_size=8)
    variants = [
        BlockHasher(other_size).hash_prompt(tokens),
        BlockHasher(other_weights).hash_prompt(tokens),
        BlockHasher(other_layout).hash_prompt(tokens),
        BlockHasher(other_block).hash_prompt(tokens * 2)[:2],
        BlockHasher(other_dtype).hash_prompt(tokens),
        BlockHasher(other_rank).hash_prompt(tokens),
        BlockHasher(FP).hash_prompt(tokens, cache_salt="tenant-a"),
        BlockHasher(FP).hash_prompt(tokens, cache_salt="tenant-b"),
        BlockHasher(FP).hash_prompt(tokens, lora_name="adapter"),
        BlockHasher(FP, algorithm="blake2b").hash_prompt(tokens),
    ]
    all_keys = {k for v in [base, *variants] for k in v}
    assert len(all_keys) == 2 * (1 + len(variants))


def test_salt_and_lora_encodings_do_not_collide() -> None:
    fp_root = root_key(FP)
    from kvtier.keys import BlockExtras

    a = block_key(fp_root, [1, 2], BlockExtras(cache_salt="x"))
    b = block_key(fp_root, [1, 2], BlockExtras(lora_name="x"))
    assert a != b


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="outside"):
        block_key(b"p", [-1])
    with pytest.raises(ValueError, match="outside"):
        block_key(b"p", [2**32])
    with pytest.raises(ConfigError, match="hash_algorithm"):
        BlockHasher(FP, algorithm="md5")


def test_engine_keys_are_opaque_bytes() -> None:
    assert engine_key(b"\x01\x02") == b"\x01\x02"
    assert engine_key(5) != engine_key(-5)
    assert len(engine_key(2**100)) == 16
    with pytest.raises(TypeError):
        engine_key("abc")  # type: ignore[arg-type]
