"""CPU <-> disk offloading: one handler each way over a ``DiskStore`` and a thread pool.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and hands the job's blocks to the direction's thread pool in stretches: a store
job in stretches of up to ``MAX_RUN_BYTES``, each written to consecutive slots with one
``pwritev``; a load job in stretches of blocks that sit in consecutive slots
(``DiskStore.runs``), each read with one ``preadv``. Several stretches are in flight at
once (the system calls release the GIL). A job finishes when all its stretches have;
``get_finished`` reports jobs in submission order even when the pool finishes them out
of order, each with per-job success and, on failure, which blocks failed and why.
Nothing a job does raises out of the handler.

Loads and stores have separate pools, so a burst of background write-through stores
never queues a load (which a request is waiting for) behind it in Python.

The handler keeps no index: the store finds a block by its key, which the spec
carries, and a store's ``DiskLoadStoreSpec.evicted_hashes`` names the blocks the
scheduler's index dropped to make room. Each store stretch removes its share of them
before it writes (their slots are then free for it), so the bytes on disk never exceed
the capacity the index accounts for. A store stretch is all or nothing: a failed one
leaves none of its blocks behind (no orphans the scheduler does not know of).

After a failed load, the destination CPU pages of that job are undefined (a block
that failed verification is zero-filled, its siblings may hold good bytes): the
scheduler drops the whole job's blocks, as it does for any failed store.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import TransferError
from kvtier.load_store_specs import DiskLoadStoreSpec
from kvtier.media.disk import MAX_RUN_BYTES, DiskStore
from kvtier.worker.handler import TransferSpec
from kvtier.worker.thread_pool_handler import (
    MAX_ERRORS_SHOWN,
    PooledHandler,
    Task,
    host_pages,
    split_spec,
)


class CpuDiskHandler(PooledHandler):
    """CPU->disk (stores) or disk->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuDiskOffloadingHandlers``. One task per stretch of consecutive slots.
    """

    def __init__(
        self,
        *,
        cpu_to_disk: bool,
        pages: np.ndarray,
        store: DiskStore,
        io_threads: int,
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

    def _plan(self, spec: TransferSpec) -> list[Task]:
        rows, disk = split_spec(spec, self.cpu_to_disk, DiskLoadStoreSpec, self._pages.shape[0])
        keys = [bytes(k) for k in disk.block_hashes]
        evicted = [bytes(k) for k in disk.evicted_hashes] if self.cpu_to_disk else []
        if not rows and evicted:  # nothing to write: one task still deletes
            return [("evicted blocks", functools.partial(self._delete, evicted))]
        if self.cpu_to_disk:  # stretches of the job, each written to consecutive slots
            per = max(1, MAX_RUN_BYTES // max(1, self._pages.shape[1]))
            groups = [list(range(i, min(i + per, len(keys)))) for i in range(0, len(keys), per)]
        else:  # blocks in consecutive slots, each stretch one read
            groups = self._store.runs(keys)
        # Each task deletes a contiguous share of the evicted keys, in proportion to its
        # blocks: blocks the scheduler evicted together (stored together, so in
        # consecutive slots) free a run for the task that writes next to them.
        shares, done = [], 0
        for group in groups:
            end = round(len(evicted) * (group[-1] + 1) / len(keys)) if keys else len(evicted)
            shares.append(evicted[done:end])
            done = end
        return [
            (
                _label([keys[i] for i in group]),
                functools.partial(
                    self._blocks, [keys[i] for i in group], [rows[i] for i in group], share
                ),
            )
            for group, share in zip(groups, shares, strict=True)
        ]

    def _blocks(self, keys: list[bytes], rows: list[int], evicted: list[bytes]) -> int:
        pages = [self._pages[r] for r in rows]
        if self.cpu_to_disk:  # all or none; the evicted blocks' slots are free for them
            self._store.write_blocks(keys, pages, evict=evicted)
        else:
            failed = self._store.read_blocks(keys, pages)
            if failed:
                shown = "; ".join(str(e) for e in failed[:MAX_ERRORS_SHOWN])
                raise TransferError(f"{len(failed)} of {len(keys)} failed: {shown}")
        return int(self._pages.shape[1]) * len(keys)

    def _delete(self, keys: list[bytes]) -> int:
        for key in keys:
            self._store.delete(key)
        return 0


def _label(keys: list[bytes]) -> str:
    first = f"block {keys[0].hex()[:16]}"
    return first if len(keys) == 1 else f"{first} and {len(keys) - 1} after it"


class CpuDiskOffloadingHandlers:
    """The CPU<->disk pair over one host page array and one ``DiskStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
            Rows 4 KiB aligned in address and size use ``O_DIRECT`` when the store
            does; other rows use buffered I/O.
        disk_store: the open store (its owner closes it).
        io_threads: blocks in flight per direction (``disk_io_threads``).
    """

    def __init__(self, cpu_pages: torch.Tensor, disk_store: DiskStore, io_threads: int = 4):
        pages = host_pages(cpu_pages, io_threads)
        self.cpu_to_disk_handler = CpuDiskHandler(
            cpu_to_disk=True, pages=pages, store=disk_store, io_threads=io_threads
        )
        self.disk_to_cpu_handler = CpuDiskHandler(
            cpu_to_disk=False, pages=pages, store=disk_store, io_threads=io_threads
        )

    def shutdown(self) -> None:
        """Shut both handlers down (each finishes its queued jobs first)."""
        self.cpu_to_disk_handler.shutdown()
        self.disk_to_cpu_handler.shutdown()
