"""Belady's offline reference: evict the block whose next use is farthest away.

Runs anywhere (pure Python, offline: it reads the whole trace first). It is the
yardstick of ``kvtier simulate``, defined as in ``docs/simulate.md``:

1. each request's hit is its prefix hit -- the longest run of resident blocks from
   its first block (as an online ``lookup`` would report);
2. then each block of the request is accessed in order; a miss inserts the block and,
   when the cache is full, evicts the resident block whose next access is farthest in
   the future (blocks never used again first).

Time is the position in the flattened sequence of block accesses, so no two
accesses tie: of a block and its prefix-chained parent, both next used by the same
request, the child's next use comes later and it goes first.

Implementation: one backward pass computes each access's next-use position; the
resident set keeps, per block, its next use, and a max-heap of ``(next use, block)``
entries with lazy deletion (an entry is live while its next use matches the block's
current one). ``O(N log N)`` for ``N`` accesses.
"""

from __future__ import annotations

import heapq

from kvtier.sim.metrics import HitCounter, HitRatios
from kvtier.sim.progress import Progress
from kvtier.sim.trace import Trace


def next_use_positions(trace: Trace) -> list[int]:
    """For each block access (trace order), the position of the next access of the
    same block, or ``len(accesses)`` if there is none."""
    flat = [hid for request in trace.requests for hid in request.hash_ids]
    never = len(flat)
    nxt = [never] * never
    last: dict[int, int] = {}
    for position in range(never - 1, -1, -1):
        hid = flat[position]
        nxt[position] = last.get(hid, never)
        last[hid] = position
    return nxt


def belady(trace: Trace, capacity_blocks: int, progress: Progress | None = None) -> HitRatios:
    """Hit ratios of Belady's farthest-next-use rule at ``capacity_blocks``.

    Args:
        trace: the trace to replay.
        capacity_blocks: resident blocks at most (``0`` caches nothing).
        progress: advanced by one per request, if given.

    Raises:
        ValueError: ``capacity_blocks`` is negative.
    """
    if capacity_blocks < 0:
        raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
    nxt = next_use_positions(trace)
    counter = HitCounter(trace.block_size)
    resident: dict[int, int] = {}  # block id -> position of its next use
    heap: list[tuple[int, int]] = []  # (-next use, block id); stale entries skipped
    position = 0
    for request in trace.requests:
        ids = request.hash_ids
        hit = 0
        for hid in ids:
            if hid not in resident:
                break
            hit += 1
        counter.add(hit, len(ids), request.input_length)
        if capacity_blocks:
            for hid in ids:
                next_use = nxt[position]
                position += 1
                if hid not in resident and len(resident) >= capacity_blocks:
                    while True:
                        neg_use, victim = heapq.heappop(heap)
                        if resident.get(victim) == -neg_use:
                            del resident[victim]
                            break
                resident[hid] = next_use
                heapq.heappush(heap, (-next_use, hid))
            if len(heap) > 4 * capacity_blocks + 1024:
                heap = [(-use, hid) for hid, use in resident.items()]
                heapq.heapify(heap)
        if progress is not None:
            progress.advance()
    return counter.ratios()
