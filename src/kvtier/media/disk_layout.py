"""Where the disk store keeps its blocks: segment files of fixed slots, and their index.

Runs on the worker side, when a ``DiskStore`` opens (the scan) and in its I/O threads
(offsets). Layout, version 2::

    <disk_path>/
      kvtier-disk-v2/                     layout version (v1, a file per block, is not read)
        <fingerprint hex>/                one model (mode 0700); another never lists it
          lock                            flock'ed by the one process that owns it
          <slot bytes>.idx                one 256-byte record per slot of that size
          <slot bytes>-<n>.seg            segment n: slots n*S .. n*S+S-1 (S per size)

A *slot* holds one block: ``HEADER_REGION`` bytes (the ``block_format`` header, zero
padded to 4 KiB) then the payload; consecutive slots are one contiguous byte range, and
with payloads a multiple of 4 KiB (every page ``O_DIRECT`` can move) every slot and
payload starts aligned::

    segment file   | slot 0           | slot 1           | ...
                   | header | payload | header | payload |
    offset         0        4096      slot_bytes

Slot ``g`` of a size lives in segment ``g // S`` at byte ``(g % S) * slot_bytes``, with
``S = slots_per_segment(slot_bytes)``. Record ``g`` of the index says which key slot
``g`` holds and when it was last used; it is a hint (every load verifies the slot's
own header), so a stale or torn record can cost a miss but never serve wrong bytes.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kvtier.media.direct_io import ALIGNMENT

LAYOUT = "kvtier-disk-v2"
HEADER_REGION = ALIGNMENT
"""Bytes before the payload in every slot: the header, zero padded."""
LOCK_NAME = "lock"
MAX_KEY_BYTES = 120
MAX_FINGERPRINT_BYTES = 64
SEGMENT_BYTES = 256 << 20
"""Target bytes of one segment file (see ``slots_per_segment``)."""
RECORD_BYTES = 256
_RECORD = struct.Struct("<B7xQ120s112x")  # key length, last use (ns), key; then checksum
_SEG_NAME = re.compile(r"^([1-9][0-9]*)-(0|[1-9][0-9]*)\.seg$")
_IDX_NAME = re.compile(r"^([1-9][0-9]*)\.idx$")


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block listed by the index at open: its key, its bytes on disk and its last use.

    Attributes:
        key: the block key (from its index record; the slot's header is checked on load).
        size: bytes of its slot (``block_file_size`` of its payload).
        mtime_ns: last store or successful load, ns since the epoch (as of the last
            clean close for loads; see ``DiskStore``).
    """

    key: bytes
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one block lives: its slot size and its slot number among slots of that size."""

    slot_bytes: int
    index: int


def block_file_size(payload_bytes: int) -> int:
    """Bytes on disk of one block whose payload is ``payload_bytes`` (its slot).

    Not rounded up: a payload that is not a multiple of 4 KiB cannot use ``O_DIRECT``
    anyway, and padding it would cost small pages capacity (a 2 KiB page would take
    8 KiB instead of 6).
    """
    return HEADER_REGION + payload_bytes


def slots_per_segment(slot_bytes: int) -> int:
    """Slots in each segment of that slot size: as many as fit ``SEGMENT_BYTES``, at least 1.

    256 MiB holds 1,000 slots of 256 KiB or 63 of 4 MiB: a job's blocks (16 by default)
    fit in one segment, so they can be one read; a 200 GiB cache is 800 files, not
    800,000; and allocating one segment (``posix_fallocate``, no bytes written) takes
    milliseconds.
    """
    return max(1, SEGMENT_BYTES // slot_bytes)


def fingerprint_dir(root: Path, fingerprint: bytes) -> Path:
    """The directory of one model's blocks under the cache directory ``root``."""
    return root / LAYOUT / fingerprint.hex()


def segment_path(directory: Path, slot_bytes: int, segment: int) -> Path:
    """Segment file ``segment`` of slots of ``slot_bytes``."""
    return directory / f"{slot_bytes}-{segment}.seg"


def index_path(directory: Path, slot_bytes: int) -> Path:
    """The index file of slots of ``slot_bytes``."""
    return directory / f"{slot_bytes}.idx"


def slot_offset(slot: Slot) -> tuple[int, int]:
    """``(segment number, byte offset in it)`` of ``slot``."""
    per = slots_per_segment(slot.slot_bytes)
    return slot.index // per, (slot.index % per) * slot.slot_bytes


def follows(prev: Slot, slot: Slot) -> bool:
    """Whether ``slot`` comes right after ``prev`` in the same segment file (one read
    or write can move both)."""
    return (
        slot.slot_bytes == prev.slot_bytes
        and slot.index == prev.index + 1
        and slot_offset(slot)[0] == slot_offset(prev)[0]
    )


def consecutive_runs(slots: Sequence[Slot | None]) -> list[list[int]]:
    """Positions of ``slots`` in stretches of consecutive slots of one segment; a
    ``None`` is a stretch of its own."""
    out: list[list[int]] = []
    for i, slot in enumerate(slots):
        prev = slots[i - 1] if i else None
        if out and slot is not None and prev is not None and follows(prev, slot):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def encode_record(key: bytes, last_use_ns: int) -> bytes:
    """The index record saying a slot holds ``key``, last used at ``last_use_ns``."""
    body = _RECORD.pack(len(key), last_use_ns, key)
    return body + xxhash.xxh3_64_digest(body)


EMPTY_RECORD = bytes(RECORD_BYTES)


def decode_record(raw: bytes) -> tuple[bytes, int] | None:
    """``(key, last use)`` from a record, or ``None`` if empty, torn or damaged."""
    if len(raw) != RECORD_BYTES:
        return None
    body, digest = raw[: _RECORD.size], raw[_RECORD.size :]
    n, last_use, key = _RECORD.unpack(body)
    if not 1 <= n <= MAX_KEY_BYTES or xxhash.xxh3_64_digest(body) != digest:
        return None
    return key[:n], last_use


@dataclass(frozen=True, slots=True)
class SizeClass:
    """The slots of one size found at open: how many exist and which record says what.

    Attributes:
        slot_bytes: bytes of each slot.
        slots: slots backed by segment files (consecutive from 0).
        records: slot number -> (key, last use) for every valid record below ``slots``.
        unreachable: segment files past a missing or short one (a crash while one was
            being added); the store removes them at open.
    """

    slot_bytes: int
    slots: int
    records: dict[int, tuple[bytes, int]]
    unreachable: tuple[Path, ...]


def scan(directory: Path) -> list[SizeClass]:
    """The slot sizes in a fingerprint directory, their slots and index records.

    Reads each index file once and ``stat``s each segment; changes nothing. Slots exist
    from 0 up to the first missing or short segment.
    """
    classes: dict[int, dict[int, int]] = {}  # slot bytes -> segment -> slots in it
    for entry in os.scandir(directory):
        m = _SEG_NAME.match(entry.name)
        if m:
            slot_bytes, seg = int(m[1]), int(m[2])
            size = entry.stat(follow_symlinks=False).st_size
            classes.setdefault(slot_bytes, {})[seg] = size // slot_bytes
        elif _IDX_NAME.match(entry.name):
            classes.setdefault(int(entry.name.split(".")[0]), {})
    found = []
    for slot_bytes, segments in sorted(classes.items()):
        per = slots_per_segment(slot_bytes)
        slots, seg = 0, 0
        while seg in segments:  # slots are contiguous from 0; a short segment is the last
            n = min(segments[seg], per)
            slots, seg = slots + n, seg + 1
            if n < per:
                break
        unreachable = tuple(segment_path(directory, slot_bytes, x) for x in segments if x >= seg)
        records: dict[int, tuple[bytes, int]] = {}
        try:
            raw = index_path(directory, slot_bytes).read_bytes()
        except FileNotFoundError:
            raw = b""
        for g in range(min(slots, len(raw) // RECORD_BYTES)):
            rec = decode_record(raw[g * RECORD_BYTES : (g + 1) * RECORD_BYTES])
            if rec is not None:
                records[g] = rec
        found.append(SizeClass(slot_bytes, slots, records, unreachable))
    return found


@dataclass(frozen=True, slots=True)
class ListedBlock:
    """A block an index record names: its key, last use, and where its slot is."""

    key: bytes
    last_use_ns: int
    segment: Path
    offset: int
    slot_bytes: int


def listed_blocks(directory: Path) -> list[ListedBlock]:
    """Every block the index files of a fingerprint directory name, in slot order.

    For tools and tests that look at a closed store's files (a key may be named twice
    after a crash; the store keeps the newer); an open store answers ``DiskStore.locate``.
    """
    out = []
    for size_class in scan(directory):
        for g, (key, last_use) in sorted(size_class.records.items()):
            seg, offset = slot_offset(Slot(size_class.slot_bytes, g))
            path = segment_path(directory, size_class.slot_bytes, seg)
            out.append(ListedBlock(key, last_use, path, offset, size_class.slot_bytes))
    return out


def find_block(directory: Path, key: bytes) -> tuple[Path, int] | None:
    """``(segment file, offset of its slot)`` of block ``key`` per the index, or ``None``."""
    named = [b for b in listed_blocks(directory) if b.key == key]
    if not named:
        return None
    newest = max(named, key=lambda b: b.last_use_ns)
    return newest.segment, newest.offset
