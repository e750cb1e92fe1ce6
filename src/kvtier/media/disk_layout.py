"""Where the disk store keeps its blocks, and the start-up scan that finds them again.

Runs on the worker side, when a ``DiskStore`` opens (the scan) and in its I/O threads
(the paths). Layout, version 1::

    <disk_path>/
      kvtier-disk-v1/                     layout version
        <fingerprint hex>/                one model (mode 0700); another never lists it
          lock                            flock'ed by the one process that owns it
          <key[0] hex>/                   256 shards keep directories small (mode 0700)
            <key hex>.kvb                 one complete block (mode 0600)
            .<key hex>.<random>.tmp       a write in progress; removed at open

A block file is ``HEADER_REGION`` bytes (the ``block_format`` header, zero padded to
4 KiB so that the payload starts aligned for ``O_DIRECT``) followed by the payload.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvtier.media.direct_io import ALIGNMENT

LAYOUT = "kvtier-disk-v1"
HEADER_REGION = ALIGNMENT
"""Bytes before the payload in every block file: the header, zero padded."""
SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
LOCK_NAME = "lock"
MAX_KEY_BYTES = 120  # 240 hex digits and the suffix stay under the 255-byte name limit
MAX_FINGERPRINT_BYTES = 64


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block file found at open: its key, its size on disk and its last use.

    Attributes:
        key: the block key (from the file name; the header is checked on load).
        size: bytes of the file (``block_file_size`` of its payload).
        mtime_ns: last store or successful load, ns since the epoch.
    """

    key: bytes
    size: int
    mtime_ns: int


def block_file_size(payload_bytes: int) -> int:
    """Bytes on disk of one block whose payload is ``payload_bytes``."""
    return HEADER_REGION + payload_bytes


def fingerprint_dir(root: Path, fingerprint: bytes) -> Path:
    """The directory of one model's blocks under the cache directory ``root``."""
    return root / LAYOUT / fingerprint.hex()


def block_path(directory: Path, key: bytes) -> Path:
    """The file of block ``key`` in a fingerprint directory."""
    name = key.hex()
    return directory / name[:2] / (name + SUFFIX)


def scan(directory: Path) -> list[StoredBlock]:
    """The blocks in a fingerprint directory, least recently used first.

    Reads names and sizes only (one ``stat`` per file). Removes what a crash can leave
    behind: temporary files of interrupted writes, and block files too short to hold
    a header. Files it does not recognise are left alone and not listed.
    """
    found: list[tuple[int, str, bytes, int]] = []
    for shard in os.scandir(directory):
        if not shard.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(shard.path):
            name = entry.name
            if name.endswith(TMP_SUFFIX):
                Path(entry.path).unlink(missing_ok=True)
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                key = bytes.fromhex(name[: -len(SUFFIX)])
                st = entry.stat(follow_symlinks=False)
            except (ValueError, OSError):
                continue
            if not key or block_path(directory, key) != Path(entry.path):
                continue
            if st.st_size < HEADER_REGION:
                Path(entry.path).unlink(missing_ok=True)
                continue
            found.append((st.st_mtime_ns, name, key, st.st_size))
    found.sort()
    return [StoredBlock(key, size, mtime) for mtime, _, key, size in found]
