"""The soak's disk area: a small tmpfs when root, filled, damaged and checked on demand.

Runs in the soak process. As root the area is a ``tmpfs`` of ``size_bytes`` mounted
by the soak, so "the disk fills up" is a real ``ENOSPC``: a filler file takes every
free byte, then goes. Without root no file system can be mounted; the area is a
plain directory, and a full disk is emulated by making the engines' cache
directories read-only (writes fail with ``EACCES``, the same failed-store path).
``mode`` says which, and the soak prints it.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import IntegrityError
from kvtier.media.block_format import decode_header, verify
from kvtier.media.disk_layout import HEADER_REGION, LAYOUT, listed_blocks


@dataclass(frozen=True, slots=True)
class BlockSlot:
    """One block of an engine's disk tier: where its slot is and which key it holds."""

    path: Path
    offset: int
    slot_bytes: int
    key: bytes

    @property
    def id(self) -> Path:
        """The slot's name for the soak's records: ``<segment path>@<offset>``."""
        return self.path.with_name(f"{self.path.name}@{self.offset}")


class DiskArea:
    """The directory under which each engine keeps its disk tier.

    Args:
        root: an empty directory to mount on (or use as it is).
        size_bytes: the tmpfs size.
    """

    def __init__(self, root: Path, size_bytes: int) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        if os.geteuid() == 0:
            cmd = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(root)]
            self.mounted = subprocess.run(cmd, capture_output=True).returncode == 0
        self.mode = (
            f"tmpfs of {size_bytes // 2**20} MiB mounted by the soak (real ENOSPC)"
            if self.mounted
            else "plain directory (not root: a full disk is emulated by read-only directories)"
        )
        self._filler = root / "filler"
        self._locked: list[Path] = []

    def engine_dir(self, name: str) -> Path:
        return self.root / f"engine-{name}"

    def fill(self) -> int:
        """Take every free byte (or make the cache directories read-only); bytes taken."""
        if not self.mounted:
            self._locked = [p for p in self.root.rglob("*") if p.is_dir()]
            for p in self._locked:
                p.chmod(stat.S_IRUSR | stat.S_IXUSR)
            return 0
        taken, size = 0, 1 << 20
        chunk = b"\xa5" * size
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while size >= 512:  # halve the write until not even 512 bytes fit
                try:
                    taken += os.write(fd, chunk[:size])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    size //= 2
        finally:
            os.close(fd)
        return taken

    def unfill(self) -> None:
        """Give the space back (or the write permission)."""
        self._filler.unlink(missing_ok=True)
        for p in self._locked:
            p.chmod(stat.S_IRWXU)
        self._locked = []

    def blocks(self, name: str) -> list[BlockSlot]:
        """The blocks of one engine's disk tier, as its index lists them, in slot order."""
        return [
            BlockSlot(b.segment, b.offset, b.slot_bytes, b.key)
            for fp_dir in sorted(self.engine_dir(name).glob(f"{LAYOUT}/*"))
            for b in listed_blocks(fp_dir)
        ]

    def damage(self, name: str, how: str, rng: random.Random) -> Path | None:
        """Flip a bit of, tear, or wipe the header of one random block's slot.

        ``truncate`` zeroes the slot from a random byte on (a torn write), ``delete``
        zeroes its header region (the block is gone). Returns the slot's id (its
        segment file's path with ``@offset``), or ``None`` if there was none.
        """
        blocks = self.blocks(name)
        if not blocks:
            return None
        block = rng.choice(blocks)
        try:
            with open(block.path, "r+b") as f:
                if how == "flip":
                    at = block.offset + rng.randrange(block.slot_bytes)
                    f.seek(at)
                    byte = f.read(1)
                    f.seek(at)
                    f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
                else:
                    start = rng.randrange(block.slot_bytes) if how == "truncate" else 0
                    end = block.slot_bytes if how == "truncate" else HEADER_REGION
                    f.seek(block.offset + start)
                    f.write(bytes(end - start))
        except OSError:
            return None  # the engine's files changed meanwhile
        return block.id

    def corrupt_blocks(self, name: str, damaged: set[Path]) -> list[str]:
        """Blocks of an engine that fail verification, less those the soak damaged.

        Each is checked as a load would: header, key (from its index record), model
        (from its directory), length and the payload's checksum.
        """
        bad = []
        for block in self.blocks(name):
            if block.id in damaged:
                continue
            try:
                with open(block.path, "rb") as f:
                    f.seek(block.offset)
                    data = f.read(block.slot_bytes)
                header = decode_header(data)
                verify(
                    data,
                    memoryview(data)[HEADER_REGION : HEADER_REGION + header.payload_length],
                    key=block.key,
                    fingerprint=bytes.fromhex(block.path.parent.name),
                )
            except FileNotFoundError:
                continue
            except (IntegrityError, ValueError) as e:
                bad.append(f"{block.id.name}: {e}")
        return bad

    def close(self) -> None:
        """Unmount the tmpfs (everything on it goes)."""
        self.unfill()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
            self.mounted = False
