"""Worker side: moves KV bytes between media. Imports torch.

Runs in each engine worker process (one per GPU). ``OffloadingWorker`` routes each
job by its ``(src medium, dst medium)`` to an ``OffloadingHandler``;
``CpuGpuOffloadingHandlers`` provides the GPU<->CPU pair over a host slab. See
``docs/worker.md``.
"""

from kvtier.worker.blockmap import expand_block_ids
from kvtier.worker.gpu_cpu import CpuGpuOffloadingHandlers, SingleDirectionHandler
from kvtier.worker.handler import OffloadingHandler, OffloadingWorker, TransferResult, TransferSpec
from kvtier.worker.kv_view import KVCacheView, KVLayout, kv_cache_view

__all__ = [
    "CpuGpuOffloadingHandlers",
    "KVCacheView",
    "KVLayout",
    "OffloadingHandler",
    "OffloadingWorker",
    "SingleDirectionHandler",
    "TransferResult",
    "TransferSpec",
    "expand_block_ids",
    "kv_cache_view",
]
