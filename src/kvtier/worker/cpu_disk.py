"""CPU <-> disk offloading: one handler each way over a ``DiskStore`` and a thread pool.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and hands one task per block to the direction's thread pool, so several block
reads or writes are in flight at once (the system calls release the GIL). A job
finishes when all its blocks have; ``get_finished`` reports jobs in submission order
even when the pool finishes them out of order, each with per-job success and, on
failure, which blocks failed and why. Nothing a job does raises out of the handler.

Loads and stores have separate pools, so a burst of background write-through stores
never queues a load (which a request is waiting for) behind it in Python.

After a failed load, the destination CPU pages of that job are undefined (a block
that failed verification is zero-filled, its siblings may hold good bytes): the
scheduler drops the whole job's blocks, as it does for any failed store.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.media.disk import DiskStore
from kvtier.specs import DiskLoadStoreSpec
from kvtier.worker.handler import TransferSpec
from kvtier.worker.pooled import PooledHandler, Task, host_pages, split_spec


class CpuDiskHandler(PooledHandler):
    """CPU->disk (stores) or disk->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuDiskOffloadingHandlers``. One task per block.
    """

    def __init__(
        self,
        *,
        cpu_to_disk: bool,
        pages: np.ndarray,
        store: DiskStore,
        io_threads: int,
        slot_keys: dict[int, bytes] | None = None,
    ) -> None:
        media = (Medium.CPU, Medium.DISK) if cpu_to_disk else (Medium.DISK, Medium.CPU)
        super().__init__(
            src_medium=media[0],
            dst_medium=media[1],
            io_threads=io_threads,
            thread_name=f"kvtier-disk-{'store' if cpu_to_disk else 'load'}",
        )
        self.cpu_to_disk = cpu_to_disk
        self._pages = pages
        self._store = store
        self._slot_keys = slot_keys  # disk slot -> key it holds; None: no tracking

    def _plan(self, spec: TransferSpec) -> list[Task]:
        rows, disk = split_spec(spec, self.cpu_to_disk, DiskLoadStoreSpec, self._pages.shape[0])
        slots = [int(b) for b in disk.block_ids] if self._slot_keys is not None else rows
        if len(slots) != len(rows):
            raise ValueError(f"{len(slots)} disk slots for {len(rows)} disk keys")
        return [
            (f"block {bytes(k).hex()[:16]}", functools.partial(self._block, bytes(k), r, d))
            for k, r, d in zip(disk.block_hashes, rows, slots, strict=True)
        ]

    def _block(self, key: bytes, row: int, slot: int) -> int:
        if self.cpu_to_disk:
            self._free_slot(slot, key)
            self._store.write(key, self._pages[row])
            if self._slot_keys is not None:
                self._slot_keys[slot] = key
        else:
            self._store.read_into(key, self._pages[row])
        return int(self._pages.shape[1])

    def _free_slot(self, slot: int, key: bytes) -> None:
        """Delete the block a reused disk slot held: the scheduler evicted it."""
        if self._slot_keys is None:
            return
        old = self._slot_keys.pop(slot, None)
        if old is not None and old != key:
            self._store.delete(old)


class CpuDiskOffloadingHandlers:
    """The CPU<->disk pair over one host page array and one ``DiskStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
            Rows 4 KiB aligned in address and size use ``O_DIRECT`` when the store
            does; other rows use buffered I/O.
        disk_store: the open store (its owner closes it).
        io_threads: blocks in flight per direction (``disk_io_threads``).
        slot_keys: when given, the handler remembers which key each disk slot (the
            ``block_ids`` of a ``DiskLoadStoreSpec``) holds, starting from this
            mapping (e.g. slot ``i`` = ``disk_store.recovered[i].key`` after a
            restart), and a store into a slot first deletes the key that slot held:
            the scheduler's evictions reach the disk with no message of their own.
            ``None``: no tracking; the owner deletes evicted keys itself
            (``DiskStore.delete``).
    """

    def __init__(
        self,
        cpu_pages: torch.Tensor,
        disk_store: DiskStore,
        io_threads: int = 4,
        slot_keys: Mapping[int, bytes] | None = None,
    ) -> None:
        pages = host_pages(cpu_pages, io_threads)
        self.cpu_to_disk_handler = CpuDiskHandler(
            cpu_to_disk=True,
            pages=pages,
            store=disk_store,
            io_threads=io_threads,
            slot_keys=None if slot_keys is None else dict(slot_keys),
        )
        self.disk_to_cpu_handler = CpuDiskHandler(
            cpu_to_disk=False, pages=pages, store=disk_store, io_threads=io_threads
        )

    def shutdown(self) -> None:
        """Shut both handlers down (each finishes its queued jobs first)."""
        self.cpu_to_disk_handler.shutdown()
        self.disk_to_cpu_handler.shutdown()
