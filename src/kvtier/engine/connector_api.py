"""The points where an offloading connector plugs into the engine, and a no-op default.

Runs in the engine's scheduler (the engine is one process: the connector's scheduler
half and worker half both live in it). The scheduler calls, per request and per step::

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

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.errors import ProtocolError
from kvtier.observability.failures import FailureKey

if TYPE_CHECKING:
    import torch

    from kvtier.engine.request import Request


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


@dataclass(frozen=True, slots=True)
class OffloadStats:
    """What a connector did since its last ``take_stats`` (zeros without offloading).

    Attributes:
        hit_blocks: blocks found offloaded, per tier that served them.
        loaded_blocks: blocks loaded into GPU pages.
        stored_blocks: blocks stored out of GPU pages.
        bytes_loaded: bytes moved into GPU pages.
        bytes_stored: bytes moved out of GPU pages.
        failed_loads: blocks whose load failed (recomputed).
        failed_stores: blocks whose store failed.
        refused_stores: blocks not stored because the tier could not make room.
        refused_loads: offloaded hits not loaded because the CPU tier could not make
            room to promote them from a secondary tier (recomputed; nothing failed).
        failures: blocks whose load or store failed, by tier, operation and reason --
            every tier, write-through to secondary tiers included (filled by the
            engine from finished jobs; see ``kvtier.observability.failures``).
    """

    hit_blocks: Mapping[Medium, int] = field(default_factory=dict)
    loaded_blocks: int = 0
    stored_blocks: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    failed_loads: int = 0
    failed_stores: int = 0
    refused_stores: int = 0
    refused_loads: int = 0
    failures: Mapping[FailureKey, int] = field(default_factory=dict)

    def __add__(self, other: OffloadStats) -> OffloadStats:
        """Both counts added (per key for the mappings): totals over several calls."""
        counts: dict[str, object] = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Mapping):
                merged = dict(mine)
                for key, n in theirs.items():
                    merged[key] = merged.get(key, 0) + n
                counts[f.name] = merged
            else:
                counts[f.name] = mine + theirs
        return OffloadStats(**counts)  # type: ignore[arg-type]


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
    ) -> int:
        """(a) At admission, after the GPU prefix match: how many blocks past it are offloaded.

        ``block_keys`` are all full blocks of the request's tokens; the first
        ``num_gpu_hit_blocks`` are GPU hits (touch them if the policy wants). Answer
        ``n``: ``block_keys[num_gpu_hit_blocks : num_gpu_hit_blocks + n]`` are ready to
        load. Called once per admission (again after a preemption); pin nothing here.
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
