"""The points where an offloading connector plugs into the engine, and a no-op default.

Runs in the engine's scheduler, in its one thread (the connector's worker half may
run in this process or in a child; see ``offload_connector``). The scheduler calls,
per request and per step::

    once:  register_kv_caches(kv_caches, block_size)
    step:  poll() ─► admit: GPU prefix match ─► (a) get_num_external_hit_blocks
                         allocate pages ─► (b) start_load ─► LoadHandle (polled each step)
                            pages reused ─► (d) on_gpu_evict   (inside allocation)
           forward ─► (c) on_blocks_full    request done ─► (f) request_finished
    generate() end: take_stats()

Keys are the engine's per-page keys (one per ``block_size`` tokens, prefix-chained);
a connector that offloads larger blocks groups them itself.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvtier.blocks import BlockHash, BlockId
from kvtier.connector.stats import OffloadStats
from kvtier.errors import ProtocolError

if TYPE_CHECKING:
    import torch

    from kvtier.engine.request import Request

__all__ = ["Connector", "LoadHandle", "LoadState", "NoOpConnector", "OffloadStats"]


class LoadState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class LoadHandle:
    """One request's external load, completed by the connector, polled by the scheduler.

    The connector creates it in ``start_load`` and calls ``complete`` once (typically
    from ``poll``). A partial success is a failure that still counts the leading blocks
    that did load: those are used, the rest are recomputed.

    Attributes:
        num_blocks: blocks asked for.
    """

    __slots__ = ("_num_loaded", "_state", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._state = LoadState.PENDING
        self._num_loaded = 0

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def num_loaded_blocks(self) -> int:
        """Leading blocks whose bytes are in their pages (valid once not ``PENDING``)."""
        return self._num_loaded

    def complete(self, num_loaded_blocks: int) -> None:
        """Report the load done: ``DONE`` when all blocks loaded, else ``FAILED``.

        Raises:
            ProtocolError: completed twice, or a count outside ``0 .. num_blocks``.
        """
        if self._state is not LoadState.PENDING:
            raise ProtocolError(f"LoadHandle.complete: already {self._state.value}")
        if not 0 <= num_loaded_blocks <= self.num_blocks:
            raise ProtocolError(
                f"LoadHandle.complete: {num_loaded_blocks} loaded of {self.num_blocks} blocks"
            )
        self._num_loaded = num_loaded_blocks
        done = num_loaded_blocks == self.num_blocks
        self._state = LoadState.DONE if done else LoadState.FAILED


@runtime_checkable
class Connector(Protocol):
    """An offloading connector, as the engine calls it. All calls come from one thread."""

    def register_kv_caches(self, kv_caches: Sequence[torch.Tensor], block_size: int) -> None:
        """Once, before any request: the pool's per-layer tensors, each
        ``(2, num_blocks, block_size, num_kv_heads, head_dim)`` on the model's device
        (the layout the worker side's GPU handlers take)."""
        ...

    def get_num_external_hit_blocks(
        self, request: Request, block_keys: Sequence[BlockHash], num_gpu_hit_blocks: int
    ) -> int | None:
        """(a) At admission, after the GPU prefix match: how many blocks past it are offloaded.

        ``block_keys`` are all full blocks of the request's tokens; the first
        ``num_gpu_hit_blocks`` are GPU hits (touch them if the policy wants). Answer
        ``n``: ``block_keys[num_gpu_hit_blocks : num_gpu_hit_blocks + n]`` are ready to
        load. Called once per admission (again after a preemption); pin nothing here.
        ``None``: not known yet (a shared tier is being asked); the engine keeps the
        request waiting and asks again on a later step.
        """
        ...

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        """(b) After the request's pages are allocated: load ``block_keys[i]`` into page
        ``gpu_block_ids[i]``. May be fewer blocks than (a) answered (the engine always
        recomputes the last prompt token). Must not block on the copy; the request waits,
        polled every step, until the handle is complete, then prefills the rest.
        """
        ...

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        """(c) After a forward pass: these pages just became full (computed, not loaded).

        The pages stay unchanged while the request holds them (see ``request_finished``).
        The eager store policy stores here.
        """
        ...

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        """(d) The GPU prefix cache drops a cached page, about to be reused.

        When this returns the engine may overwrite the page: copy it out synchronously,
        or order the copy before the engine's next forward pass (on CUDA, make the
        current stream wait for it). The on_evict store policy stores here.
        """
        ...

    def poll(self) -> Sequence[str]:
        """(e) Once per engine step, first: drain finished jobs, complete load handles.

        Returns the ids of finished requests whose pages the connector no longer reads
        (those for which ``request_finished`` returned ``True``).
        """
        ...

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        """(f) The request is done. ``True``: its pages are still being read (stores in
        flight); the engine keeps them until ``poll`` returns the request's id."""
        ...

    def take_stats(self) -> OffloadStats:
        """Counters since the last call; the engine calls it at the end of ``generate``."""
        ...

    def close(self) -> None:
        """Finish the work in flight and release what the connector holds."""
        ...


class NoOpConnector:
    """No offloading: nothing is ever offloaded, loaded or stored."""

    def register_kv_caches(self, kv_caches: Sequence[torch.Tensor], block_size: int) -> None:
        return None

    def get_num_external_hit_blocks(
        self, request: Request, block_keys: Sequence[BlockHash], num_gpu_hit_blocks: int
    ) -> int:
        return 0

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        raise ProtocolError("NoOpConnector.start_load: it reported no external hits")

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        return None

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        return None

    def poll(self) -> Sequence[str]:
        return ()

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        return False

    def take_stats(self) -> OffloadStats:
        return OffloadStats()

    def close(self) -> None:
        return None
