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
from pathlib import Path

from kvtier.errors import IntegrityError
from kvtier.media.block_format import verify
from kvtier.media.disk_layout import HEADER_REGION, LAYOUT, SUFFIX


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

    def block_files(self, name: str) -> list[Path]:
        """The block files of one engine's disk tier, in name order."""
        return sorted(self.engine_dir(name).glob(f"{LAYOUT}/*/*/*{SUFFIX}"))

    def damage(self, name: str, how: str, rng: random.Random) -> Path | None:
        """Flip a byte of, truncate, or delete one random block file; the file, if any."""
        files = self.block_files(name)
        if not files:
            return None
        path = rng.choice(files)
        try:
            size = path.stat().st_size
            if how == "flip":
                offset = rng.randrange(size)
                with open(path, "r+b") as f:
                    f.seek(offset)
                    byte = f.read(1)
                    f.seek(offset)
                    f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
            elif how == "truncate":
                os.truncate(path, rng.randrange(size))
            else:
                path.unlink()
        except OSError:
            return None  # the engine evicted or replaced it meanwhile
        return path

    def corrupt_blocks(self, name: str, damaged: set[Path]) -> list[str]:
        """Block files of an engine that fail verification, less those the soak damaged.

        Each is checked as a load would: size, header, key (from its name), model
        (from its directory) and the payload's CRC.
        """
        bad = []
        for path in self.block_files(name):
            if path in damaged:
                continue
            try:
                data = path.read_bytes()
                verify(
                    data,
                    memoryview(data)[HEADER_REGION:],
                    key=bytes.fromhex(path.name[: -len(SUFFIX)]),
                    fingerprint=bytes.fromhex(path.parent.parent.name),
                )
            except FileNotFoundError:
                continue
            except (IntegrityError, ValueError) as e:
                bad.append(f"{path.name}: {e}")
        return bad

    def close(self) -> None:
        """Unmount the tmpfs (everything on it goes)."""
        self.unfill()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
            self.mounted = False
