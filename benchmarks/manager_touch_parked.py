"""Touch cost of ``kvtier bench manager``'s hot keys with the pinned blocks parked.

The bench times touches before any store, so its pinned blocks are never parked then;
in use they are, once an eviction has reached them. This fills a tier of 200,000
blocks, pins the ``--pinned`` coldest, stores one batch (the search parks them), then
times rounds of touches of 400 batches of 64 resident keys; prints the median CPU ns
per touched block. Run it once per tree, alternating, from the repository root::

    PYTHONPATH=/tmp/base/src nice python benchmarks/manager_touch_parked.py --policy lru
    PYTHONPATH=src nice python benchmarks/manager_touch_parked.py --policy lru
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvtier.blocks import BlockHash
from kvtier.scheduler import CPUOffloadingManager

BLOCKS = 200_000
BATCH = 64


def key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(8, "little"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--pinned", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    m = CPUOffloadingManager(num_blocks=BLOCKS, block_size=16, eviction_policy=args.policy)
    for start in range(0, BLOCKS, BATCH):
        ks = [key(i) for i in range(start, start + BATCH)]
        m.prepare_store(ks)
        m.complete_store(ks)
    if args.pinned:
        m.prepare_load([key(i) for i in range(args.pinned)])
    ks = [key(BLOCKS + i) for i in range(BATCH)]
    m.prepare_store(ks)  # evicts past the pinned blocks: parks them
    m.complete_store(ks)
    hot = [[key(args.pinned + 1000 + r * BATCH + j) for j in range(BATCH)] for r in range(400)]
    times = []
    for _ in range(args.repeats):
        t0 = time.thread_time()
        for batch in hot:
            m.touch(batch)
        times.append(time.thread_time() - t0)
    per_block = statistics.median(times) / (len(hot) * BATCH) * 1e9
    print(f"{args.policy} touch with {args.pinned} pinned (parked): {per_block:.0f} ns/block")


if __name__ == "__main__":
    main()
