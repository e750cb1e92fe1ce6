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
does not matter (vLLM starts the workers before the scheduler). The manager unlinks
it at shutdown; the mappings stay valid until every process has closed them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.config import positive_int
from kvtier.errors import ConfigError

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

    def __init__(self, path: Path, layout: RegionLayout, mapping: mmap.mmap) -> None:
        self.path = path
        self.layout = layout
        self._mmap: mmap.mmap | None = mapping
        self._array = np.frombuffer(mapping, dtype=np.uint8)

    @classmethod
    def open(cls, path: Path, layout: RegionLayout) -> HostRegion:
        """Map the region at ``path``, creating the file if no process has yet.

        Raises:
            ConfigError: (key ``shm_dir``) the directory is missing or not writable,
                or a file of another size is there (another engine's, or stale).
        """
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError("shm_dir", f"cannot create {path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, layout.total_bytes)
            elif size != layout.total_bytes:
                raise ConfigError(
                    "shm_dir",
                    f"{path} holds {size} bytes, expected {layout.total_bytes}: a stale "
                    "region of an engine with the same id; remove the file",
                )
            mapping = mmap.mmap(fd, layout.total_bytes, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        return cls(path, layout, mapping)

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
            self.path.unlink()

    def close(self) -> None:
        """Drop this process's mapping; views handed out must not be used after."""
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            del self._array
            # A view (a tensor) still exporting it keeps it mapped until the GC frees it.
            with contextlib.suppress(BufferError):
                mapping.close()
