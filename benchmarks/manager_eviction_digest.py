"""A digest of the eviction order of each policy on a generated workload, per tree.

A change of a policy's tables must not change what it evicts. For each policy and
source tree this drives a ``CPUOffloadingManager`` of ``--blocks`` blocks through a
seeded stream of lookups, loads (pins held over several steps), touches, stores (some
of keys stored before: returning ghosts) and failed stores, and hashes every
``prepare_store`` result's evicted keys, in order, with the step they came at. Same
digests: the same evictions in the same order. From the repository root::

    nice python benchmarks/manager_eviction_digest.py --side base=/tmp/base/src \
        --side now=src --policy arc --policy slru
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys


def child(policy: str, blocks: int, steps: int, seed: int) -> None:
    """The digest of one policy's evictions (printed as JSON with the counts)."""
    import random

    from kvtier.blocks import BlockHash
    from kvtier.scheduler import CPUOffloadingManager

    rng = random.Random(seed)
    m = CPUOffloadingManager(num_blocks=blocks, block_size=16, eviction_policy=policy)
    digest = hashlib.sha256()
    universe = 6 * blocks  # keys come back after being evicted (ghosts return)
    pins: list[list[BlockHash]] = []
    evicted = 0

    def key(i: int) -> BlockHash:
        return BlockHash(i.to_bytes(8, "little"))

    def prefix() -> list[BlockHash]:
        start = int(rng.paretovariate(1.2) * 7) % universe  # a skewed popularity
        return [key((start * 16 + j) % universe) for j in range(rng.randint(1, 12))]

    for step in range(steps):
        op = rng.random()
        keys = prefix()
        if op < 0.3:
            m.lookup(keys)
        elif op < 0.4:
            hit = m.lookup(keys)
            if hit:
                m.prepare_load(keys[:hit])
                pins.append(keys[:hit])
        elif op < 0.5 and pins:
            m.complete_load(pins.pop(rng.randrange(len(pins))))
        elif op < 0.6:
            m.touch(keys)
        else:
            out = m.prepare_store(keys)
            if out is not None:
                digest.update(step.to_bytes(4, "little"))
                for k in out.block_hashes_evicted:
                    digest.update(k)
                evicted += len(out.block_hashes_evicted)
                m.complete_store(out.block_hashes_to_store, success=rng.random() > 0.05)
    stats = m.stats()
    print(
        json.dumps(
            {
                "digest": digest.hexdigest(),
                "evicted": evicted,
                "stores": stats.stores,
                "hit_blocks": stats.hit_blocks,
            }
        )
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", action="append", required=True, help="NAME=SRC_DIR")
    parser.add_argument("--policy", action="append", required=True)
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sides = dict(s.split("=", 1) for s in args.side)
    same = True
    for policy in args.policy:
        found = {}
        for name, src in sides.items():
            env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
            cmd = [sys.executable, __file__, "--child", policy]
            cmd += [str(args.blocks), str(args.steps), str(args.seed)]
            done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            found[name] = json.loads(done.stdout)
            print(f"{policy:<9}{name:<6} {found[name]}", flush=True)
        same = same and len({json.dumps(r, sort_keys=True) for r in found.values()}) == 1
    print("the same evictions on every side" if same else "THE EVICTIONS DIFFER")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
