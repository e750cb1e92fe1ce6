"""CPU <-> remote offloading: one handler each way over a ``RemoteStore`` and a thread pool.

Runs in the worker process. ``transfer_async`` validates the spec in the caller's
thread and hands the whole job to the direction's thread pool as one task: one
pipelined batch (``RemoteStore.write_many`` / ``read_many_into``) per ``batch_bytes``
on one connection. ``io_threads`` jobs are in flight per direction, each on its own
connection. ``get_finished`` reports jobs in submission order even when the pool
finishes them out of order, each with per-job success and, on failure, why. Nothing a
job does raises out of the handler: a dead or slow Redis, a miss and a corrupt value
all become a failed job, and the scheduler recomputes.

Loads and stores have separate pools, so background write-through never queues a load
(which a request waits for) behind it.

After a failed load, the destination CPU pages of the blocks that failed are zeroed
(the others of the job hold good bytes); the scheduler drops the whole job's blocks.
The ``block_ids`` of a ``RemoteLoadStoreSpec`` (slots of the scheduler's index) are not
used here: a remote value is named by its key alone, and the server's own LRU, not
the handler, removes values (see ``docs/remote.md``).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kvtier.blocks import Medium
from kvtier.errors import KvtierError, TransferError
from kvtier.load_store_specs import RemoteLoadStoreSpec
from kvtier.media.remote import ReadOutcome, RemoteStore
from kvtier.worker.handler import TransferSpec
from kvtier.worker.thread_pool_handler import PooledHandler, Task, host_pages, split_spec


def _describe_misses(keys: list[bytes], outcomes: list[ReadOutcome]) -> str:
    missed = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.MISS]
    corrupt = [k for k, o in zip(keys, outcomes, strict=True) if o is ReadOutcome.CORRUPT]
    parts = []
    if missed:
        parts.append(f"{len(missed)} missed (evicted, expired or never stored)")
    if corrupt:
        parts.append(f"{len(corrupt)} failed verification (deleted)")
    first = (missed + corrupt)[0].hex()[:16]
    return f"{len(missed) + len(corrupt)} of {len(keys)} block(s) not loaded: " + (
        ", ".join(parts) + f"; first {first}"
    )


class CpuRemoteHandler(PooledHandler):
    """CPU->remote (stores) or remote->CPU (loads), finished in submission order.

    See ``OffloadingHandler`` for the contract. Build both with
    ``CpuRemoteOffloadingHandlers``. One task per job: a pipelined batch.
    """

    def __init__(
        self, *, cpu_to_remote: bool, pages: np.ndarray, store: RemoteStore, io_threads: int
    ) -> None:
        media = (Medium.CPU, Medium.REMOTE) if cpu_to_remote else (Medium.REMOTE, Medium.CPU)
        super().__init__(
            src_medium=media[0],
            dst_medium=media[1],
            io_threads=io_threads,
            thread_name=f"kvtier-remote-{'store' if cpu_to_remote else 'load'}",
        )
        self.cpu_to_remote = cpu_to_remote
        self._pages = pages
        self._store = store

    def _plan(self, spec: TransferSpec) -> list[Task]:
        rows, remote = split_spec(
            spec, self.cpu_to_remote, RemoteLoadStoreSpec, self._pages.shape[0]
        )
        keys = [bytes(k) for k in remote.block_hashes]
        for k in keys:
            self._store.redis_key(k)  # checks the key's length
        verb = "store" if self.cpu_to_remote else "load"
        return [(f"remote {verb}", functools.partial(self._batch, keys, rows))]

    def _batch(self, keys: list[bytes], rows: list[int]) -> int:
        pages = [self._pages[r] for r in rows]
        if self.cpu_to_remote:
            self._store.write_many(keys, pages)
        else:
            try:
                outcomes = self._store.read_many_into(keys, pages)
            except KvtierError:
                raise
            except Exception:
                for page in pages:  # no plausible wrong bytes left behind
                    page[:] = 0
                raise
            if any(o is not ReadOutcome.HIT for o in outcomes):
                raise TransferError(_describe_misses(keys, outcomes))
        return len(rows) * int(self._pages.shape[1])


class CpuRemoteOffloadingHandlers:
    """The CPU<->remote pair over one host page array and one ``RemoteStore``.

    Args:
        cpu_pages: the CPU tier's host memory, a C-contiguous CPU ``uint8`` tensor of
            shape ``(num_cpu_blocks, block_bytes)``; row ``c`` is CPU block ``c``.
        remote_store: the store (its owner closes it); give it at least
            ``2 * io_threads + 1`` connections (``RemoteOptions.max_connections``: one
            left for its own commands, EXISTS, DEL, PING).
        io_threads: jobs in flight per direction (``remote_io_threads``).
    """

    def __init__(self, cpu_pages: torch.Tensor, remote_store: RemoteStore, io_threads: int = 2):
        pages = host_pages(cpu_pages, io_threads)
        self.cpu_to_remote_handler = CpuRemoteHandler(
            cpu_to_remote=True, pages=pages, store=remote_store, io_threads=io_threads
        )
        self.remote_to_cpu_handler = CpuRemoteHandler(
            cpu_to_remote=False, pages=pages, store=remote_store, io_threads=io_threads
        )

    def shutdown(self) -> None:
        """Shut both handlers down (each finishes its queued jobs first)."""
        self.cpu_to_remote_handler.shutdown()
        self.remote_to_cpu_handler.shutdown()
