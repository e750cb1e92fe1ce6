"""A disk store with an encryption key, on real files: no plaintext in them, the same
key hits (after a reopen too), and every block that is not this key's, this model's
and this slot's -- another key, no key, a plaintext block, slots swapped, a directory
moved to another model -- is ``undecryptable``, zero-filled and deleted; rotation
keeps the old key's blocks readable."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import IntegrityError
from kvtier.key_file import EncryptionKey
from kvtier.keys import BlockHasher, ModelFingerprint
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import HEADER_REGION, block_file_size, fingerprint_dir

FP = b"\x3d" * 32
BLOCK = 64 * 1024
MiB = 1 << 20
OLD, NEW = EncryptionKey.of(b"o" * 32), EncryptionKey.of(b"n" * 32)


def key(i: int) -> bytes:
    return i.to_bytes(2, "big") * 16


def payload(i: int) -> np.ndarray:
    out = aligned_empty(BLOCK)
    out[:] = np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)
    return out


def open_store(path: Path, keys: tuple[EncryptionKey, ...], *, fp: bytes = FP,
               direct: bool | None = None) -> DiskStore:  # fmt: skip
    return DiskStore.open(path, fp, 16 * MiB, direct_io=direct, keys=keys)


def write(store: DiskStore, ids: range) -> None:
    store.write_blocks([key(i) for i in ids], [payload(i) for i in ids])


def read(store: DiskStore, ids: range) -> tuple[list[str | None], list[np.ndarray]]:
    """Per block: ``None`` (loaded, bytes checked) or the failure's reason; the pages."""
    outs = [aligned_empty(BLOCK) for _ in ids]
    for out in outs:
        out[:] = 0xAB
    failed = {str(e).split(":")[0]: e for e in store.read_blocks([key(i) for i in ids], outs)}
    reasons: list[str | None] = []
    for i, out in zip(ids, outs, strict=True):
        error = failed.get(f"block {key(i).hex()[:16]}")
        if error is None:
            assert np.array_equal(out, payload(i)), i
            reasons.append(None)
        else:
            assert isinstance(error, IntegrityError) and not out.any(), i  # zeroed
            reasons.append(error.reason)
    return reasons, outs


def windows(i: int) -> list[bytes]:
    """Distinctive 64-byte stretches of payload ``i`` (random bytes: found by chance
    with probability ~2**-512)."""
    raw = payload(i).tobytes()
    return [raw[at : at + 64] for at in (0, BLOCK // 3, BLOCK - 64)]


def file_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_no_plaintext_in_any_file_and_the_same_key_hits_after_a_reopen(
    tmp_path: Path, direct: bool
) -> None:
    plain = open_store(tmp_path / "plain", (), direct=direct)
    write(plain, range(6))
    plain.close()
    found = file_bytes(tmp_path / "plain")
    assert all(w in found for i in range(6) for w in windows(i))  # the grep finds plaintext
    store = open_store(tmp_path / "sealed", (NEW,), direct=direct)
    write(store, range(6))
    assert read(store, range(6))[0] == [None] * 6
    store.close()
    sealed = file_bytes(tmp_path / "sealed")
    assert not any(w in sealed for i in range(6) for w in windows(i))
    again = open_store(tmp_path / "sealed", (NEW,), direct=direct)
    assert sorted(again.keys()) == sorted(key(i) for i in range(6))
    assert read(again, range(6))[0] == [None] * 6
    again.close()


@pytest.mark.parametrize(
    ("writer", "reader", "why"),
    [
        ((OLD,), (NEW,), "sealed with key"),
        ((NEW,), (), "a sealed block, and this tier has no encryption_key_file"),
        ((), (NEW,), "a plaintext block, and this tier reads only sealed blocks"),
    ],
    ids=["another key", "no key", "plaintext to a keyed tier"],
)
def test_blocks_of_another_key_or_format_are_undecryptable_and_deleted(
    tmp_path: Path,
    writer: tuple[EncryptionKey, ...],
    reader: tuple[EncryptionKey, ...],
    why: str,
) -> None:
    store = open_store(tmp_path, writer)
    write(store, range(4))
    store.close()
    store = open_store(tmp_path, reader)
    outs = [aligned_empty(BLOCK) for _ in range(4)]
    failed = store.read_blocks([key(i) for i in range(4)], outs)
    assert [e.reason for e in failed] == ["undecryptable"] * 4  # type: ignore[attr-defined]
    assert all(why in str(e) for e in failed) and not any(o.any() for o in outs)
    assert store.keys() == []  # deleted: the slots are free for this tier's own blocks
    write(store, range(4))
    assert read(store, range(4))[0] == [None] * 4
    store.close()


def _swap_slots(store: DiskStore, a: bytes, b: bytes) -> None:
    (pa, oa), (pb, ob) = store.locate(a), store.locate(b)  # type: ignore[misc]
    size = block_file_size(BLOCK)
    with open(pa, "r+b") as fa, open(pb, "r+b") as fb:
        fa.seek(oa)
        raw_a = fa.read(size)
        fb.seek(ob)
        raw_b = fb.read(size)
        fa.seek(oa)
        fa.write(raw_b)
        fb.seek(ob)
        fb.write(raw_a)


def test_slots_swapped_between_two_keys_open_for_neither(tmp_path: Path) -> None:
    """Each slot now holds a well-formed block sealed with this very key: only the
    block key in the seal's associated data tells it is not the block asked for."""
    store = open_store(tmp_path, (NEW,))
    write(store, range(4))
    _swap_slots(store, key(1), key(2))
    assert read(store, range(4))[0] == [None, "undecryptable", "undecryptable", None]
    store.close()


def test_a_directory_moved_to_another_model_opens_nothing(tmp_path: Path) -> None:
    """Another model's directory, the same key file: the fingerprint in the seal's
    associated data (and the per-model subkey) refuses every block."""
    store = open_store(tmp_path, (NEW,))
    write(store, range(3))
    store.close()
    other = b"\x3e" * 32
    shutil.rmtree(fingerprint_dir(tmp_path, other), ignore_errors=True)
    shutil.copytree(fingerprint_dir(tmp_path, FP), fingerprint_dir(tmp_path, other))
    moved = open_store(tmp_path, (NEW,), fp=other)
    assert sorted(moved.keys()) == sorted(key(i) for i in range(3))  # the records say so
    assert read(moved, range(3))[0] == ["undecryptable"] * 3
    moved.close()


def test_rotation_the_new_key_seals_the_old_one_still_opens(tmp_path: Path) -> None:
    store = open_store(tmp_path, (OLD,))
    write(store, range(3))
    store.close()
    rotated = open_store(tmp_path, (NEW, OLD))
    assert read(rotated, range(3))[0] == [None] * 3
    write(rotated, range(3, 6))
    path, offset = rotated.locate(key(4))  # type: ignore[misc]
    with open(path, "rb") as f:
        f.seek(offset + 20)
        assert f.read(8) == NEW.key_id  # written with the first key
    rotated.close()
    retired = open_store(tmp_path, (NEW,))  # the old key dropped from the file
    assert read(retired, range(6))[0] == ["undecryptable"] * 3 + [None] * 3
    retired.close()


def test_a_torn_sealed_slot_is_corrupt_or_undecryptable_never_served(tmp_path: Path) -> None:
    store = open_store(tmp_path, (NEW,))
    write(store, range(2))
    path, offset = store.locate(key(0))  # type: ignore[misc]
    with open(path, "r+b") as f:  # half of a later write of the payload landed
        f.seek(offset + HEADER_REGION + BLOCK // 2)
        f.write(bytes(BLOCK // 2))
    assert read(store, range(2))[0] == ["undecryptable", None]
    path, offset = store.locate(key(1))  # type: ignore[misc]
    with open(path, "r+b") as f:  # the header itself damaged: a storage fault
        f.seek(offset + 30)
        f.write(b"\xff")
    assert read(store, range(1, 2))[0] == ["header_checksum_mismatch"]
    store.close()


def test_one_tenants_blocks_never_open_under_another_tenants_keys(tmp_path: Path) -> None:
    """The same tokens under two cache salts: the block keys differ (``kvtier.keys``), and
    the seal binds the block key, so tenant A's bytes copied over tenant B's slots open
    for neither B nor anyone asking for B's blocks."""
    hasher = BlockHasher(ModelFingerprint("m", "float16", "L2", block_size=4))
    tokens = list(range(16))
    ours, theirs = hasher.hash_prompt(tokens, "tenant-a"), hasher.hash_prompt(tokens, "tenant-b")
    assert not set(ours) & set(theirs)
    store = open_store(tmp_path, (NEW,))
    store.write_blocks(ours, [payload(i) for i in range(4)])
    store.write_blocks(theirs, [payload(10 + i) for i in range(4)])
    size = block_file_size(BLOCK)
    for a, b in zip(ours, theirs, strict=True):
        (pa, oa), (pb, ob) = store.locate(a), store.locate(b)  # type: ignore[misc]
        with open(pa, "rb") as fa, open(pb, "r+b") as fb:
            fa.seek(oa)
            fb.seek(ob)
            fb.write(fa.read(size))
    outs = [aligned_empty(BLOCK) for _ in range(8)]
    failed = store.read_blocks([*ours, *theirs], outs)
    assert [e.reason for e in failed] == ["undecryptable"] * 4  # type: ignore[attr-defined]
    assert all(np.array_equal(outs[i], payload(i)) for i in range(4))  # A's still open as A's
    assert not any(o.any() for o in outs[4:])
    store.close()
