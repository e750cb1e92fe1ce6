"""DiskStore: round trips on both I/O paths, persistence, corruption, crashes, capacity.

The segment layout itself (slots, runs, the index) is tested in ``test_disk_segments``."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvtier.media.disk as disk_module
import kvtier.media.disk_recovery as disk_recovery
from kvtier.errors import ConfigError, IntegrityError, TransferError
from kvtier.media import block_format, direct_io
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import HEADER_REGION, block_file_size

from .test_block_format import version_1_header

FP = b"\x11" * 32
BLOCK = 64 * 1024
MiB = 1 << 20


def key(i: int) -> bytes:
    return i.to_bytes(2, "big") * 16


def payload(i: int, n: int = BLOCK, aligned: bool = True) -> np.ndarray:
    out = aligned_empty(n) if aligned else np.empty(n + 1, np.uint8)[1:]
    out[:] = np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)
    return out


@pytest.fixture
def store(tmp_path: Path, direct: bool) -> Iterator[DiskStore]:
    s = DiskStore.open(tmp_path / "cache", FP, 16 * MiB, direct_io=direct)
    yield s
    s.close()


def test_round_trip(store: DiskStore, direct: bool) -> None:
    assert store.direct_io is direct
    for i, aligned in enumerate([True, False, True]):
        src = payload(i, aligned=aligned)
        assert store.write(key(i), src) == block_file_size(BLOCK)
        dst = aligned_empty(BLOCK) if aligned else np.zeros(BLOCK + 1, np.uint8)[1:]
        store.read_into(key(i), dst)
        assert np.array_equal(src, dst)
    odd = payload(9, n=1000)  # not a multiple of 4 KiB: buffered on both paths
    store.write(key(9), odd)
    back = bytearray(1000)
    store.read_into(key(9), back)
    assert bytes(back) == odd.tobytes()
    assert len(store) == 4 and store.used_bytes == 3 * block_file_size(BLOCK) + 4096 + 1000


def test_files_are_private(store: DiskStore) -> None:
    store.write(key(7), payload(7))
    where = store.locate(key(7))
    assert where is not None
    path = where[0]
    assert path.parent == store.directory
    for f in store.directory.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    for d in (store.directory, store.directory.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_persists_across_instances_in_lru_order(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 16 * MiB)
    for i in range(3):
        s.write(key(i), payload(i))
    s.read_into(key(0), aligned_empty(BLOCK))  # block 0 becomes the most recent
    s.close()
    s = DiskStore.open(tmp_path, FP, 16 * MiB)
    assert [b.key for b in s.recovered] == [key(1), key(2), key(0)]
    assert s.used_bytes == 3 * block_file_size(BLOCK)
    out = aligned_empty(BLOCK)
    s.read_into(key(2), out)
    assert np.array_equal(out, payload(2))
    other = DiskStore.open(tmp_path, b"\x22" * 32, 16 * MiB)  # another model
    assert other.recovered == () and key(2) not in other
    s.close()
    other.close()


CHILD_WRITER = """
import sys
from kvtier.media.disk import DiskStore
sys.path.insert(0, {tests!r})
from tests.media.test_disk import FP, key, payload
s = DiskStore.open({path!r}, FP, 1 << 30)
for i in range({n}):
    behind = i - {keep}  # evicted by this write (its file reused), when keep > 0
    s.write(key(i), payload(i), evict=[key(behind)] if {keep} and behind >= 0 else [])
    if i == {announce}:
        print("writing", flush=True)
"""


def _child(path: Path, n: int, keep: int = 0, announce: int = 0) -> subprocess.Popen[str]:
    tests = str(Path(__file__).parents[2])
    code = CHILD_WRITER.format(tests=tests, path=str(path), n=n, keep=keep, announce=announce)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )


def test_persists_across_processes(tmp_path: Path) -> None:
    child = _child(tmp_path, 5)
    child.communicate()  # no bound of its own: importing torch alone took 30 s under load
    assert child.returncode == 0
    s = DiskStore.open(tmp_path, FP, 16 * MiB)
    assert sorted(b.key for b in s.recovered) == [key(i) for i in range(5)]
    for i in range(5):
        out = aligned_empty(BLOCK)
        s.read_into(key(i), out)
        assert np.array_equal(out, payload(i))
    s.close()


def test_sigkill_during_writes_leaves_nothing_corrupt(tmp_path: Path) -> None:
    child = _child(tmp_path, 3000, announce=20)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "writing"  # 20 writes landed: kill mid-stream
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    s = DiskStore.open(tmp_path, FP, 1 << 30)
    assert len(s.recovered) >= 20
    by_key = {key(i): i for i in range(20_000)}
    for block in s.recovered:
        out = aligned_empty(BLOCK)
        try:
            s.read_into(block.key, out)
        except IntegrityError:  # allowed (reported missing), but never wrong bytes
            assert block.key not in s
            continue
        assert np.array_equal(out, payload(by_key[block.key]))
    s.close()


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05])
def test_sigkill_while_overwriting_evicted_files_leaves_nothing_corrupt(
    tmp_path: Path, delay: float
) -> None:
    """A writer that keeps 8 blocks, each write reusing the slot of the block 8 back,
    killed mid-stream: what the next process lists loads exactly or is a miss."""
    child = _child(tmp_path, 60_000, keep=8, announce=50)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "writing"  # files are being reused by now
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    s = DiskStore.open(tmp_path, FP, 1 << 30)
    assert 1 <= len(s.recovered) <= 9  # 8 kept, one more between its record and eviction
    by_key = {key(i): i for i in range(60_000)}
    for block in s.recovered:
        out = aligned_empty(BLOCK)
        try:
            s.read_into(block.key, out)
        except IntegrityError:  # allowed (reported missing), but never wrong bytes
            assert block.key not in s
            continue
        assert np.array_equal(out, payload(by_key[block.key]))
    s.close()


def test_a_write_reuses_the_slot_of_a_block_it_evicts(store: DiskStore) -> None:
    store.write(key(1), payload(1))
    where = store.locate(key(1))
    assert store.write(key(2), payload(2), evict=[key(1)]) == block_file_size(BLOCK)
    assert store.locate(key(2)) == where  # the same slot
    assert key(1) not in store and store.used_bytes == block_file_size(BLOCK)
    out = aligned_empty(BLOCK)
    store.read_into(key(2), out)
    assert np.array_equal(out, payload(2))
    with pytest.raises(TransferError):
        store.read_into(key(1), out)


def test_an_evicted_block_of_another_size_frees_its_own_size(store: DiskStore) -> None:
    store.write(key(1), payload(1, 2 * BLOCK))
    store.write(key(3), payload(3))
    where = store.locate(key(3))
    store.write(key(2), payload(2), evict=[key(1), key(3)])  # key 3's slot fits
    assert sorted(store.keys()) == [key(2)]
    assert store.used_bytes == block_file_size(BLOCK)
    assert store.locate(key(2)) == where
    out = aligned_empty(BLOCK)
    store.read_into(key(2), out)
    assert np.array_equal(out, payload(2))


def test_a_failed_overwrite_of_an_evicted_slot_leaves_neither_block(
    tmp_path: Path, store: DiskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half the new bytes land in the victim's slot, then EIO: the victim is gone
    (evicted), the new block is not stored, the bytes are released, and a restart
    lists neither."""
    store.write(key(1), payload(1))

    def torn(fd: int, buffers: list[np.ndarray], offset: int) -> int:
        os.pwrite(fd, buffers[0], offset)  # the new header; the payload never lands
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(disk_module, "pwrite_all", torn)
    with pytest.raises(TransferError, match="I/O error"):
        store.write(key(2), payload(2), evict=[key(1)])
    assert len(store) == 0 and store.used_bytes == 0 and store.free_bytes == 16 * MiB
    store.close()
    again = DiskStore.open(tmp_path / "cache", FP, 16 * MiB)
    assert again.recovered == ()
    again.close()


def test_one_owner_per_directory(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, MiB)
    with pytest.raises(ConfigError) as info:
        DiskStore.open(tmp_path, FP, MiB)
    assert info.value.key == "disk_path"
    s.close()
    DiskStore.open(tmp_path, FP, MiB).close()


def test_leftovers_of_a_crash_are_ignored_or_removed_at_open(tmp_path: Path) -> None:
    """A segment past a short one (a crash while one was added) is removed; a torn
    or garbage index record is no block; files it does not know are left alone."""
    s = DiskStore.open(tmp_path, FP, MiB)
    s.write(key(1), payload(1))
    where = s.locate(key(1))
    assert where is not None
    s.close()
    slot_bytes = block_file_size(BLOCK)
    stray = s.directory / f"{slot_bytes}-7.seg"
    stray.write_bytes(bytes(slot_bytes))
    with open(s.directory / f"{slot_bytes}.idx", "r+b") as f:
        f.seek(256 * 3)
        f.write(os.urandom(256))
    (s.directory / "notes.txt").write_text("mine")
    s = DiskStore.open(tmp_path, FP, MiB)
    assert not stray.exists() and (s.directory / "notes.txt").exists()
    assert [b.key for b in s.recovered] == [key(1)] and s.locate(key(1)) == where
    s.close()


def _corrupt_then_load(store: DiskStore, damage: str) -> str:
    k = key(5)
    store.write(k, payload(5))
    where = store.locate(k)
    assert where is not None
    path, offset = where
    with open(path, "rb") as f:
        f.seek(offset)
        raw = bytearray(f.read(block_file_size(BLOCK)))
    length = BLOCK
    if damage == "payload":
        raw[HEADER_REGION + 777] ^= 0x80
    elif damage == "header":
        raw[20] ^= 0x01
    elif damage == "wrong key":
        header = block_format.encode_header(key(6), FP, bytes(raw[HEADER_REGION:]))
        raw[: len(header)] = header
    elif damage == "wrong fingerprint":
        header = block_format.encode_header(k, b"\x22" * 32, bytes(raw[HEADER_REGION:]))
        raw[: len(header)] = header
    elif damage == "wrong length":
        length = BLOCK - 4096
    elif damage == "version 1":  # a block written before the XXH3-64 format
        header = version_1_header(k, FP, bytes(raw[HEADER_REGION:]))
        raw[:HEADER_REGION] = header + bytes(HEADER_REGION - len(header))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(raw)
    if damage == "truncated":
        os.truncate(path, offset + len(raw) - 100)
    out = aligned_empty(length)
    out[:] = 0xAB
    with pytest.raises(IntegrityError) as info:
        store.read_into(k, out)
    assert not out.any(), "a failed load leaves zeros, never plausible bytes"
    assert store.locate(k) is None and k not in store, "a corrupt block is deleted"
    assert store.used_bytes == 0
    assert info.value.reason is not None and k.hex()[:16] in str(info.value)
    return info.value.reason


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("payload", "checksum_mismatch"),
        ("header", "header_checksum_mismatch"),
        ("truncated", "truncated"),
        ("wrong key", "key_mismatch"),
        ("wrong fingerprint", "fingerprint_mismatch"),
        ("wrong length", "length_mismatch"),
        ("version 1", "wrong_version"),
    ],
)
def test_corruption_is_a_miss(store: DiskStore, damage: str, reason: str) -> None:
    assert _corrupt_then_load(store, damage) == reason


def test_missing_block_is_a_transfer_error(store: DiskStore) -> None:
    with pytest.raises(TransferError, match="not on disk"):
        store.read_into(key(1), aligned_empty(BLOCK))
    store.write(key(1), payload(1))
    where = store.locate(key(1))
    assert where is not None
    with open(where[0], "r+b") as f:  # zeroed behind the store's back
        f.seek(where[1])
        f.write(bytes(block_file_size(BLOCK)))
    with pytest.raises(IntegrityError) as info:
        store.read_into(key(1), aligned_empty(BLOCK))
    assert info.value.reason == "bad_magic"
    assert key(1) not in store and store.used_bytes == 0


def test_capacity_is_refused_not_exceeded(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 2 * block_file_size(BLOCK))
    s.write(key(1), payload(1))
    s.write(key(2), payload(2))
    with pytest.raises(TransferError, match="full"):
        s.write(key(3), payload(3))
    assert key(3) not in s and s.locate(key(3)) is None
    assert sum(p.stat().st_size for p in s.directory.glob("*.seg")) == s.capacity_bytes
    assert s.delete(key(1)) and not s.delete(key(1))
    s.write(key(3), payload(3))
    assert s.free_bytes == 0 and sorted(s.keys()) == [key(2), key(3)]
    s.close()


def test_lowered_capacity_drops_the_oldest_at_open(tmp_path: Path) -> None:
    s = DiskStore.open(tmp_path, FP, 16 * MiB)
    for i in range(4):
        s.write(key(i), payload(i))
    s.close()
    s = DiskStore.open(tmp_path, FP, 2 * block_file_size(BLOCK))
    assert [b.key for b in s.recovered] == [key(2), key(3)]
    # the blocks were moved into the slots the capacity still allows; the files shrank
    assert sum(p.stat().st_size for p in s.directory.glob("*.seg")) == 2 * block_file_size(BLOCK)
    for i in (2, 3):
        out = aligned_empty(BLOCK)
        s.read_into(key(i), out)
        assert np.array_equal(out, payload(i))
    s.close()
    s = DiskStore.open(tmp_path, FP, 16 * MiB)  # and so does the next open
    assert [b.key for b in s.recovered] == [key(2), key(3)]
    s.close()


def test_enospc_fails_cleanly(store: DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_module, "pwrite_all", full)
    with pytest.raises(TransferError, match="No space left"):
        store.write(key(1), payload(1))
    assert store.used_bytes == 0 and store.free_bytes == store.capacity_bytes
    assert key(1) not in store


def test_enospc_on_a_real_small_file_system(tmp_path: Path) -> None:
    """A 1 MiB tmpfs that something else fills: the store's own check passes, the disk says no."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        s = DiskStore.open(mnt, FP, 512 * 1024)
        (mnt / "filler").write_bytes(b"\0" * (900 * 1024))
        with pytest.raises(TransferError, match="No space left"):
            s.write(key(1), payload(1, n=256 * 1024))
        assert s.used_bytes == 0 and len(s) == 0
        (mnt / "filler").unlink()
        s.write(key(1), payload(1, n=256 * 1024))  # and works again once there is room
        s.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_config_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError) as info:
        DiskStore.open(tmp_path / "file" / "cache", FP, MiB)
    assert info.value.key == "disk_path"
    for bad in (0, -1):
        with pytest.raises(ConfigError) as info:
            DiskStore.open(tmp_path, FP, bad)
        assert info.value.key == "disk_bytes_to_use"
    with pytest.raises(ConfigError, match="available") as info:
        DiskStore.open(tmp_path, FP, 1 << 60)
    assert info.value.key == "disk_bytes_to_use"


def test_direct_io_falls_back_where_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: str, flags: int, *args: int) -> int:
        if flags & direct_io.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    assert not direct_io.supports_direct_io(tmp_path)
    with pytest.raises(ConfigError) as info:
        DiskStore.open(tmp_path, FP, MiB, direct_io=True)
    assert info.value.key == "disk_direct_io"
    s = DiskStore.open(tmp_path, FP, MiB)
    assert not s.direct_io
    s.write(key(1), payload(1))
    out = aligned_empty(BLOCK)
    s.read_into(key(1), out)
    assert np.array_equal(out, payload(1))
    s.close()


def test_tmpfs_paths(tmp_path: Path) -> None:
    """/dev/shm is tmpfs: O_DIRECT or not depends on the kernel; either way it works."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    s = DiskStore.open(f"/dev/shm/kvtier-test-{os.getpid()}", FP, MiB)
    try:
        s.write(key(1), payload(1))
        out = aligned_empty(BLOCK)
        s.read_into(key(1), out)
        assert np.array_equal(out, payload(1))
    finally:
        s.close()
        subprocess.run(["rm", "-rf", f"/dev/shm/kvtier-test-{os.getpid()}"], check=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["write", "write_evicting", "delete", "read"]),
            st.integers(0, 7),
            st.sampled_from([4096, 8192, 12288, 5000]),
        ),
        max_size=30,
    ),
    capacity=st.integers(4096, 6 * 16384),
)
def test_capacity_never_exceeded(ops: list[tuple[str, int, int]], capacity: int) -> None:
    """Against a dict model: same keys, same bytes, and never more than the capacity.

    ``write_evicting`` writes key ``i`` evicting key ``i + 3`` (mod 8): its slot is
    reused when its size matches, freed otherwise, gone either way. The segment files
    of each slot size never exceed the capacity either."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as d:
        s = DiskStore.open(d, FP, capacity)
        model: dict[bytes, np.ndarray] = {}
        for op, i, n in ops:
            k = key(i)
            if op.startswith("write"):
                evict = [key((i + 3) % 8)] if op == "write_evicting" else []
                for e in evict:
                    model.pop(e, None)
                fits = (
                    sum(block_file_size(len(v)) for v in model.values()) + block_file_size(n)
                    <= capacity
                )
                try:
                    s.write(k, payload(i * 31 + n, n), evict=evict)
                    model[k] = payload(i * 31 + n, n)
                    assert fits
                except TransferError:
                    assert not fits
            elif op == "delete":
                assert s.delete(k) == (model.pop(k, None) is not None)
            elif k in model:
                out = bytearray(len(model[k]))
                s.read_into(k, out)
                assert bytes(out) == model[k].tobytes()
            want = sum(block_file_size(len(v)) for v in model.values())
            assert s.used_bytes == want <= capacity
            for slot_bytes in {block_file_size(n) for _, _, n in ops}:  # per size
                files = Path(s.directory).glob(f"{slot_bytes}-*.seg")
                assert sum(p.stat().st_size for p in files) <= capacity
            assert sorted(s.keys()) == sorted(model)
        s.close()


def test_a_size_larger_than_the_file_system_fails_before_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 TiB: a ConfigError naming the key, raised before anything is listed or sized."""
    s = DiskStore.open(tmp_path, FP, MiB)
    s.write(key(1), payload(1))
    s.close()
    scanned: list[Path] = []
    monkeypatch.setattr(disk_recovery, "scan", lambda d: scanned.append(d) or [])
    with pytest.raises(ConfigError, match="in the whole file system") as info:
        DiskStore.open(tmp_path, FP, 100 * 2**40)
    assert info.value.key == "disk_bytes_to_use" and "100.0 GiB" not in str(info.value)
    assert "102400.0 GiB" in str(info.value)
    assert scanned == []
    DiskStore.open(tmp_path, FP, MiB).close()  # the lock was released


def test_spec_checks_the_disk_size_before_building_the_disk_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo of 100 TiB answers at once with the key; no slot table is sized."""
    import kvtier.offloading_spec as spec_module
    import kvtier.tiers as tiers_module
    from kvtier.keys import ModelFingerprint

    def recording(*args: object, **kwargs: object) -> object:
        # Before the fix this built a 400-million-slot free list and was OOM-killed.
        raise AssertionError(f"the disk index was sized first: {kwargs.get('num_blocks')} slots")

    monkeypatch.setattr(tiers_module, "TierManager", recording)
    fingerprint = ModelFingerprint("m", "float16", "L1xH1xD8", 4)
    geometry = spec_module.KVGeometry(
        gpu_block_size=4, page_bytes=64 * 1024, fingerprint=fingerprint
    )
    config = {
        "cpu_bytes_to_use": 8 * MiB,
        "block_size": 4,
        "disk_path": str(tmp_path / "cache"),
        "disk_bytes_to_use": 100 * 2**40,
    }
    with pytest.raises(ConfigError) as info:  # the spec checks sizes when it is built
        spec_module.OffloadingSpec(config, geometry).get_manager()
    assert info.value.key == "disk_bytes_to_use"
