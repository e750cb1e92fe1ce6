"""DiskStore with segment files against a plain dict, across restarts and damaged slots."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.errors import IntegrityError, TransferError
from kvtier.media import block_format, disk_layout
from kvtier.media.direct_io import aligned_empty
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import HEADER_REGION, block_file_size

FP = b"\x55" * 32
BLOCK = 4096
SLOT = block_file_size(BLOCK)
CAPACITY = 10 * SLOT
KEYS = st.integers(0, 13)
HEADER = block_format.header_size(16, len(FP))


def key(i: int) -> bytes:
    return bytes([i + 1]) * 16


def payload(seed: int) -> np.ndarray:
    out = aligned_empty(BLOCK)
    out[:] = np.random.default_rng(seed).integers(0, 256, BLOCK, dtype=np.uint8)
    return out


class DiskStoreMachine(RuleBasedStateMachine):
    """Model: key -> the seed of the bytes stored under it. Segments of 3 slots."""

    def __init__(self) -> None:
        super().__init__()
        self.saved_segment_bytes = disk_layout.SEGMENT_BYTES
        disk_layout.SEGMENT_BYTES = 3 * SLOT
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-disk-machine-"))
        self.store = DiskStore.open(self.dir, FP, CAPACITY)
        self.model: dict[bytes, int] = {}
        self.seed = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        disk_layout.SEGMENT_BYTES = self.saved_segment_bytes

    @rule(
        ks=st.lists(KEYS, min_size=1, max_size=4, unique=True),
        evict=st.lists(KEYS, max_size=3, unique=True),
    )
    def write(self, ks: list[int], evict: list[int]) -> None:
        keys = [key(i) for i in ks]
        gone = [key(i) for i in evict if key(i) not in keys]
        for k in gone:
            self.model.pop(k, None)
        fits = (len(self.model) + len(keys)) * SLOT <= CAPACITY
        seeds = [self.seed + n for n in range(len(keys))]
        self.seed += len(keys)
        try:
            written = self.store.write_blocks(
                keys, [payload(s) for s in seeds], evict=[key(i) for i in evict]
            )
        except TransferError as e:
            assert not fits and "full" in str(e)
            return
        assert fits and written == len(keys) * SLOT
        self.model.update(zip(keys, seeds, strict=True))

    @rule(k=KEYS)
    def delete(self, k: int) -> None:
        assert self.store.delete(key(k)) == (self.model.pop(key(k), None) is not None)

    @rule(ks=st.lists(KEYS, min_size=1, max_size=5, unique=True))
    def read(self, ks: list[int]) -> None:
        keys = [key(i) for i in ks]
        outs = [aligned_empty(BLOCK) for _ in keys]
        failed = self.store.read_blocks(keys, outs)
        assert sorted(str(e)[6:22] for e in failed) == sorted(
            k.hex()[:16] for k in keys if k not in self.model
        )
        for k, out in zip(keys, outs, strict=True):
            if k in self.model:
                assert np.array_equal(out, payload(self.model[k]))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), where=st.integers(0, SLOT - 1))
    def damage(self, data: st.DataObject, where: int) -> None:
        k = data.draw(st.sampled_from(sorted(self.model)))
        located = self.store.locate(k)
        assert located is not None
        path, offset = located
        with open(path, "r+b") as f:
            f.seek(offset + where)
            byte = f.read(1)[0]
            f.seek(offset + where)
            f.write(bytes([byte ^ 0x10]))
        out = aligned_empty(BLOCK)
        harmless = HEADER <= where < HEADER_REGION  # the header region's zero padding
        try:
            self.store.read_into(k, out)
        except IntegrityError:
            assert not harmless and not out.any()
            del self.model[k]
            return
        assert harmless and np.array_equal(out, payload(self.model[k]))

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = DiskStore.open(self.dir, FP, CAPACITY)
        assert sorted(b.key for b in self.store.recovered) == sorted(self.model)

    @invariant()
    def agrees(self) -> None:
        s = self.store
        assert sorted(s.keys()) == sorted(self.model)
        assert s.used_bytes == len(self.model) * SLOT <= CAPACITY
        assert sum(p.stat().st_size for p in s.directory.glob("*.seg")) <= CAPACITY
        where = [s.locate(k) for k in self.model]
        assert len(set(where)) == len(where), "one block per slot"


DiskStoreMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None
)
TestDiskStoreMachine = DiskStoreMachine.TestCase
