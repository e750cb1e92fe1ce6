"""The GPU prefix cache: KV pages named by block key, ref-counted, evicted in LRU order.

Runs in the engine's scheduler, pure Python (no tensors): it only hands out page ids of
the ``KVPool``. A page is in exactly one of three places::

    in use (ref_count > 0) ──free──► free, cached (has a key; still hit-able; LRU order)
        ▲                                 │ allocate evicts the least recently freed:
        │ allocate                        │ on_evict(key, block_id), then reuse
        └──────────── free, clean (no key) ◄┘

A page gets its key through ``commit`` once all its tokens are computed (or loaded), so
only full pages are ever hits. Pairs are "ask, then act": ``can_allocate`` then
``allocate``; ``allocate`` without room is a protocol error.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.blocks import BlockHash, BlockId
from kvtier.errors import ProtocolError

EvictCallback = Callable[[BlockHash, BlockId], None]
"""Told ``(key, block_id)`` when a cached page is evicted, before its memory is reused."""


@dataclass(slots=True)
class _Page:
    ref_count: int = 0
    key: BlockHash | None = None


class BlockManager:
    """Ref-counted pages with a prefix cache of freed pages.

    Args:
        num_blocks: pages in the pool.
        on_evict: called with ``(key, block_id)`` when ``allocate`` evicts a cached page,
            before the page is handed out (the connector's chance to copy it out).
    """

    def __init__(self, num_blocks: int, on_evict: EvictCallback | None = None) -> None:
        self.num_blocks = num_blocks
        self._on_evict = on_evict
        self._pages = [_Page() for _ in range(num_blocks)]
        self._by_key: dict[BlockHash, BlockId] = {}
        self._free_clean: deque[BlockId] = deque(BlockId(i) for i in range(num_blocks))
        self._free_cached: OrderedDict[BlockId, None] = OrderedDict()  # oldest first

    # -- queries ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Pages ``allocate`` can hand out (clean ones and evictable cached ones)."""
        return len(self._free_clean) + len(self._free_cached)

    @property
    def num_cached(self) -> int:
        """Pages with a key, in use or not."""
        return len(self._by_key)

    def ref_count(self, block_id: BlockId) -> int:
        return self._pages[block_id].ref_count

    def key_of(self, block_id: BlockId) -> BlockHash | None:
        return self._pages[block_id].key

    def lookup(self, keys: Sequence[BlockHash]) -> list[BlockId]:
        """Pages holding the longest run of ``keys``, from the first. Changes nothing."""
        hits: list[BlockId] = []
        for key in keys:
            block_id = self._by_key.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, hits: Sequence[BlockId], num_new: int) -> bool:
        """Whether ``allocate(hits, num_new)`` would succeed now."""
        reclaimed = sum(1 for b in hits if self._pages[b].ref_count == 0)
        return num_new >= 0 and num_new + reclaimed <= self.num_free

    # -- actions ------------------------------------------------------------------------

    def allocate(self, hits: Sequence[BlockId], num_new: int) -> list[BlockId]:
        """Take a reference on the hit pages and hand out ``num_new`` fresh ones.

        Fresh pages come from clean pages first, then from cached pages in LRU order
        (each evicted with ``on_evict``). Returns ``[*hits, *fresh]``.

        Raises:
            ProtocolError: a hit is not a cached page, or ``can_allocate`` is false.
        """
        for b in hits:
            if self._pages[b].key is None:
                raise ProtocolError(f"allocate: hit block {b} holds no cached key")
        if not self.can_allocate(hits, num_new):
            raise ProtocolError(
                f"allocate: {num_new} new blocks and {len(hits)} hits do not fit in "
                f"{self.num_free} free blocks (ask can_allocate first)"
            )
        for b in hits:
            page = self._pages[b]
            if page.ref_count == 0:
                del self._free_cached[b]
            page.ref_count += 1
        fresh = [self._take_fresh() for _ in range(num_new)]
        return [*hits, *fresh]

    def commit(self, block_id: BlockId, key: BlockHash) -> bool:
        """Name a full, in-use page by its key so that later requests can hit it.

        Returns ``False`` (and leaves the page unnamed) when another page already holds
        ``key``: two requests computed the same block; the first one stays the hit.

        Raises:
            ProtocolError: the page is free, or already named.
        """
        page = self._pages[block_id]
        if page.ref_count == 0:
            raise ProtocolError(f"commit: block {block_id} is free")
        if page.key is not None:
            raise ProtocolError(f"commit: block {block_id} already holds a key")
        if key in self._by_key:
            return False
        page.key = key
        self._by_key[key] = block_id
        return True

    def free(self, block_ids: Sequence[BlockId]) -> None:
        """Drop one reference on each page (a request's table; freed last page first).

        Freeing in reverse makes a request's tail the least recently used, so its shared
        prefix outlives it in the cache.

        Raises:
            ProtocolError: a page is already free (nothing is changed then).
        """
        for b in block_ids:
            if self._pages[b].ref_count <= 0:
                raise ProtocolError(f"free: block {b} is not in use")
        if len(set(block_ids)) != len(block_ids):
            raise ProtocolError("free: a block id appears twice")
        for b in reversed(block_ids):
            page = self._pages[b]
            page.ref_count -= 1
            if page.ref_count == 0:
                if page.key is None:
                    self._free_clean.append(b)
                else:
                    self._free_cached[b] = None

    def _take_fresh(self) -> BlockId:
        if self._free_clean:
            block_id = self._free_clean.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            page = self._pages[block_id]
            key = page.key
            assert key is not None
            del self._by_key[key]
            page.key = None
            page.ref_count = 1
            if self._on_evict is not None:
                self._on_evict(key, block_id)
            return block_id
        self._pages[block_id].ref_count = 1
        return block_id
