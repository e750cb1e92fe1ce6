"""Instructions and cache misses per stored+evicted block, counted by cachegrind.

Timings on a shared machine spread by +-20 %; counts do not. For each policy, pin count
and source tree, this runs the store loop of ``kvtier bench manager`` under
``valgrind --tool=cachegrind`` twice -- with ``--stores`` rounds and with none -- and
reports the difference per block: instructions, L1 data misses, and misses of a
simulated 1 MiB last level (roughly the accesses that leave the core's L2).

The loop (``--child``): fill a tier of 200,000 blocks in batches of 64, pin the
``pinned`` coldest by one load, one round of the bench's 400 lookups, touches and
loads of hot keys, 400 untimed store rounds, then the counted rounds of 64 new keys
(``prepare_store`` + ``complete_store``, each evicting 64), then ``os._exit`` (no
teardown counted); both runs make the same keys beforehand. ``--op touch`` (or
``load``) counts rounds of the bench's touches (or loads) of the hot keys instead,
right after the setup's round of each (the bench times them before any store), per
touched (loaded) block. Deterministic for a given build. Run from the repository
root::

    nice python benchmarks/manager_cachegrind.py --side base=/tmp/base/src \
        --side now=src --policy arc --policy slru \
        --out benchmarks/results/manager-cachegrind.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BLOCKS = 200_000
BATCH = 64
ROUNDS = 400


def child(policy: str, pinned: int, stores: int, made: int, op: str) -> None:
    """The counted process: setup, then ``stores`` store rounds (of ``made`` rounds'
    keys made beforehand, the same in both runs, so making keys is not counted). With
    ``op`` ``touch`` (or ``load``), ``stores`` rounds of the bench's touches (or
    ``prepare_load`` + ``complete_load``) of hot keys instead, right after the setup's
    one round of each, as the bench times them (before any store)."""
    from kvtier.blocks import BlockHash
    from kvtier.scheduler import CPUOffloadingManager

    def key(i: int) -> BlockHash:
        return BlockHash(i.to_bytes(8, "little"))

    m = CPUOffloadingManager(num_blocks=BLOCKS, block_size=16, eviction_policy=policy)
    for start in range(0, BLOCKS, BATCH):
        ks = [key(i) for i in range(start, start + BATCH)]
        m.prepare_store(ks)
        m.complete_store(ks)
    if pinned:
        m.prepare_load([key(i) for i in range(pinned)])
    hot = [
        [key(pinned + (r * BATCH + j) % (BLOCKS - pinned)) for j in range(BATCH)]
        for r in range(ROUNDS)
    ]
    for ks in hot:
        m.lookup(ks)
    for ks in hot:
        m.touch(ks)
    for ks in hot:
        m.prepare_load(ks)
        m.complete_load(ks)
    if op != "store":
        for r in range(stores):
            ks = hot[r % ROUNDS]
            if op == "touch":
                m.touch(ks)
            else:
                m.prepare_load(ks)
                m.complete_load(ks)
        sys.stdout.flush()
        os._exit(0)
    fresh = iter(range(BLOCKS, BLOCKS + (ROUNDS + made) * BATCH))
    batches = [[key(next(fresh)) for _ in range(BATCH)] for _ in range(ROUNDS + made)]
    for ks in batches[: ROUNDS + stores]:
        out = m.prepare_store(ks)
        assert out is not None and len(out.block_hashes_evicted) == BATCH
        m.complete_store(ks)
    sys.stdout.flush()
    os._exit(0)


VALGRIND = ("--tool=cachegrind", "--cache-sim=yes", "--D1=65536,4,64", "--LL=1048576,8,64")
"""The simulated caches: 64 KiB 4-way L1d, 1 MiB 8-way last level, 64-byte lines."""


def cachegrind_totals(script: str, child_args: list[str], env: dict[str, str]) -> dict[str, int]:
    """Cachegrind's totals for one run of ``python script --child *child_args``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", *VALGRIND, f"--cachegrind-out-file={out}"]
        cmd += [sys.executable, script, "--child", *child_args]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M)
    summary = re.search(r"^summary: (.*)$", text, re.M)
    assert events and summary, "no cachegrind summary"
    return dict(zip(events.group(1).split(), map(int, summary.group(1).split()), strict=True))


def misses_per_block(full: dict[str, int], empty: dict[str, int], n: int) -> dict[str, float]:
    """Instructions and misses of a run with ``n`` stored blocks less those of one with
    none, per block."""
    return {
        "instructions": round((full["Ir"] - empty["Ir"]) / n),
        "d1_misses": round((full["D1mr"] + full["D1mw"] - empty["D1mr"] - empty["D1mw"]) / n, 1),
        "l2_misses_1MiB": round(
            (full["DLmr"] + full["DLmw"] - empty["DLmr"] - empty["DLmw"]) / n, 1
        ),
    }


def git_head() -> str:
    """The commit of the checkout this runs in ("" outside git)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def counts(
    src: str, policy: str, pinned: int, stores: int, made: int, op: str
) -> dict[str, int]:
    """Cachegrind's totals for one child run with ``src`` on the path."""
    env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
    args = [policy, str(pinned), str(stores), str(made), op]
    return cachegrind_totals(__file__, args, env)


def per_block(src: str, policy: str, pinned: int, stores: int, op: str) -> dict[str, float]:
    """Counts of ``stores`` rounds less those of none, per block (stored+evicted,
    touched, or loaded)."""
    full = counts(src, policy, pinned, stores, stores, op)
    empty = counts(src, policy, pinned, 0, stores, op)
    return misses_per_block(full, empty, stores * BATCH)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", action="append", required=True, help="NAME=SRC_DIR")
    parser.add_argument("--policy", action="append", required=True)
    parser.add_argument("--pinned", type=int, nargs="*", default=[0, 50_000])
    parser.add_argument("--stores", type=int, default=800, help="counted rounds")
    parser.add_argument(
        "--op", choices=("store", "touch", "load"), default="store", help="the counted loop"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sides = dict(s.split("=", 1) for s in args.side)
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for policy in args.policy:
        for pinned in args.pinned:
            for name, src in sides.items():
                r = per_block(str(Path(src).resolve()), policy, pinned, args.stores, args.op)
                results.setdefault(policy, {}).setdefault(str(pinned), {})[name] = r
                print(
                    f"{policy:<9}{pinned:>7} {name:<6} {r['instructions']:>6} instr "
                    f"{r['d1_misses']:>6} L1d {r['l2_misses_1MiB']:>6} 1MiB-misses",
                    flush=True,
                )
    if args.out:
        doc = {
            "benchmark": "manager_cachegrind",
            "commit": git_head(),
            "sides": sides,
            "configuration": {
                "blocks": BLOCKS,
                "batch": BATCH,
                "stores": args.stores,
                "op": args.op,
                "pinned": args.pinned,
                "python": sys.version.split()[0],
                "valgrind": " ".join(VALGRIND),
            },
            "per_block": results,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
