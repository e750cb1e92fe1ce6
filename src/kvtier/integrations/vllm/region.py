"""The CPU tier's bytes in one shared-memory file, seen by every vLLM process.

vLLM builds the spec in EngineCore (the scheduler: kvtier's manager) and in each
worker process (one per rank). The workers copy GPU pages into the CPU tier and back;
the manager promotes blocks from disk or Redis into it and writes them out, off the
scheduler thread. Both sides therefore map the same host memory: a file in
``/dev/shm`` named after the engine, laid out as one slab per rank and one status
byte per (rank, block)::

    | rank 0: num_blocks x shard_bytes | rank 1: ... | ... | status: ranks x num_blocks |

A rank's shard of offloaded block ``c`` is row ``c`` of its slab, so a rank only ever
touches its own slab. A status byte is set by a worker whose store into that block
failed (vLLM treats every failed transfer as fatal, so the worker reports success
and the manager, reading the byte, drops the block instead of serving it).

Whoever opens first creates the file; both sides compute the same size, so the order
does not matter (vLLM starts the workers before the scheduler).

The file is the size of the whole CPU tier, so it must never outlive its engine.
Ownership dies with the processes: every process that maps the region holds a shared
``flock`` on it for as long as it does, and the kernel drops the lock when the process
exits, however it exits. The file is removed

* by the last process to close it (it can take the lock exclusively), and by the
  manager at shutdown (the mappings stay valid until every process has closed them);
* by the region's reaper (``reaper``): a small process, started by the creator, that
  waits for the exclusive lock and removes the file -- vLLM's server SIGKILLs its
  engine processes right after their SIGTERM, so nothing of theirs runs at exit;
* at the next start of any engine on the host, when even the reaper was killed (a
  whole process group SIGKILLed): opening a region first removes every
  ``kvtier-vllm-*.slab`` in the directory that no live process holds. A live
  neighbour's file is locked and left alone.

A new file is made under a temporary name, locked, and only then linked to its name,
so no process ever sees an unlocked region under a region's name.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.config import positive_int
from kvtier.errors import ConfigError

logger = logging.getLogger(__name__)

STORE_OK = 0
STORE_FAILED = 1


@dataclass(frozen=True, slots=True)
class RegionLayout:
    """Sizes of a region.

    Attributes:
        num_blocks: offloaded blocks of the CPU tier.
        shard_bytes: bytes of one rank's shard of one offloaded block.
        world_size: ranks (slabs).
    """

    num_blocks: int
    shard_bytes: int
    world_size: int

    def __post_init__(self) -> None:
        for name in ("num_blocks", "shard_bytes", "world_size"):
            positive_int(name, getattr(self, name))

    @property
    def slab_bytes(self) -> int:
        return self.num_blocks * self.shard_bytes

    @property
    def total_bytes(self) -> int:
        return self.world_size * self.slab_bytes + self.world_size * self.num_blocks


def region_path(shm_dir: str, engine_id: str) -> Path:
    """The file of one engine's region (the engine id made safe for a file name)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", engine_id) or "engine"
    return Path(shm_dir) / f"kvtier-vllm-{safe}.slab"


class HostRegion:
    """A mapped region. Build it with ``HostRegion.open``.

    Attributes:
        path: the shared file.
        layout: its sizes.
    """

    def __init__(self, path: Path, layout: RegionLayout, mapping: mmap.mmap, fd: int) -> None:
        self.path = path
        self.layout = layout
        self._mmap: mmap.mmap | None = mapping
        self._array = np.frombuffer(mapping, dtype=np.uint8)
        self._fd: int | None = fd  # holds the shared lock while the region is mapped
        self._inode = os.fstat(fd).st_ino
        atexit.register(self.close)

    @classmethod
    def open(cls, path: Path, layout: RegionLayout) -> HostRegion:
        """Map the region at ``path``, creating the file if no process has yet.

        Removes what killed engines left in the directory first (files no process
        holds), and starts the reaper of a region it creates.

        Raises:
            ConfigError: (key ``shm_dir``) the directory is missing or not writable,
                or a live process holds a region of another size under this name
                (another engine with the same id).
        """
        reclaim(path.parent)
        for _ in range(_OPEN_TRIES):
            fd = _open_locked(path)
            created = False
            if fd is None:
                fd = _create_locked(path, layout.total_bytes)
                created = fd is not None
            if fd is not None:
                break
        else:  # pragma: no cover - only if files keep vanishing under us
            raise ConfigError("shm_dir", f"{path} kept vanishing while being opened")
        try:
            size = os.fstat(fd).st_size
            if size != layout.total_bytes:
                raise ConfigError(
                    "shm_dir",
                    f"{path} holds {size} bytes, expected {layout.total_bytes}: a region "
                    "of a live engine with the same id; give each engine its own id",
                )
            mapping = mmap.mmap(fd, layout.total_bytes, mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        if created:
            _start_reaper(path, os.fstat(fd).st_ino)
        return cls(path, layout, mapping, fd)

    def slab(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s slab: ``(num_blocks, shard_bytes)`` uint8, shared memory."""
        lay = self.layout
        if not 0 <= rank < lay.world_size:
            raise ValueError(f"rank {rank} outside 0..{lay.world_size - 1}")
        start = rank * lay.slab_bytes
        return self._array[start : start + lay.slab_bytes].reshape(lay.num_blocks, lay.shard_bytes)

    def status(self) -> np.ndarray:
        """The status bytes, ``(world_size, num_blocks)`` uint8: ``STORE_OK`` / ``STORE_FAILED``."""
        lay = self.layout
        start = lay.world_size * lay.slab_bytes
        return self._array[start:].reshape(lay.world_size, lay.num_blocks)

    def unlink(self) -> None:
        """Remove the file (mappings stay valid); idempotent."""
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()

    def close(self) -> None:
        """Drop this process's mapping and lock, removing the file if no other
        process holds it; views handed out must not be used after. Idempotent (also
        run at interpreter exit)."""
        atexit.unregister(self.close)
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            del self._array
            # A view (a tensor) still exporting it keeps it mapped until the GC frees it.
            with contextlib.suppress(BufferError):
                mapping.close()
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another process still maps it: the last one removes it
        else:
            self.unlink()
        finally:
            os.close(fd)


_OPEN_TRIES = 8
_STALE = re.compile(r"kvtier-vllm-.*\.slab")
_TEMP = re.compile(r"\.kvtier-vllm-.*\.tmp")


def _open_locked(path: Path) -> int | None:
    """The region file under ``path``, share-locked; ``None`` when there is none."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError("shm_dir", f"cannot open {path}: {exc.strerror}") from None
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)  # removed (reclaimed) between the open and the lock: try again
    return None


def _create_locked(path: Path, size: int) -> int | None:
    """A new region file of ``size`` bytes linked to ``path``, share-locked; ``None``
    when another process linked one there first."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError("shm_dir", f"cannot create {temp}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.ftruncate(fd, size)
        os.link(temp, path)
    except (FileExistsError, FileNotFoundError):
        # another process linked its region first, or reclaimed our temporary file
        # before we locked it: open theirs, or try again
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise ConfigError("shm_dir", f"cannot create {path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
    return fd


def reclaim(directory: Path) -> list[Path]:
    """Remove the region files in ``directory`` that no live process holds.

    Returns the files removed. A file some process holds (a live engine) is left
    alone; so is anything that is not a kvtier region file.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed  # open() reports a bad directory
    for name in names:
        if not (_STALE.fullmatch(name) or _TEMP.fullmatch(name)):
            continue
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
                removed.append(path)
                logger.warning("kvtier: removed %s, left by an engine that was killed", path)
        except (BlockingIOError, FileNotFoundError):
            pass  # held by a live process, or already gone
        finally:
            os.close(fd)
    return removed


def _start_reaper(path: Path, inode: int) -> None:
    """Start the process that removes the region once no process holds it."""
    script = Path(__file__).with_name("reaper.py")
    try:
        starter = subprocess.Popen(
            [sys.executable, "-I", str(script), str(path), str(inode)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        starter.wait(timeout=30)  # it forks the reaper and exits at once
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning(
            "kvtier: could not start the reaper of %s (%s); if this engine is killed, "
            "the next engine to start removes the file",
            path,
            exc,
        )
