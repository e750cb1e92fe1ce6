"""Cache misses and time per stored+evicted block of five table layouts (a prototype).

A prototype, not the manager: it replays only the hash-table and queue operations that
``kvtier bench manager``'s store loop makes per block under ``arc`` (or ``slru``):
64 new keys per round, each round evicting the 64 coldest blocks of T1 (probation)
into the ghost list B1 (the ghosts), the ghosts bounded as in the bench. Layouts:

* ``now``: the manager's slot map (a dict of every resident key), T1 as an
  ``OrderedDict``, B1 as a set beside a FIFO of its keys -- the structures the code
  keeps today (issue 15, fifth round).
* ``ring``: the slot map, T1 as a plain dict beside a FIFO of its entries (as the
  fifth round's reverted list), B1 as now (a set beside its own FIFO).
* ``l1b``: the slot map, and one dict for T1 and B1 (key -> which list), T1's and
  B1's orders as two FIFOs: a victim's record is rewritten in place (T1 -> B1) and
  its entry copied from T1's FIFO to B1's. The shape an exact build needs: B1's order
  is eviction order, which is not T1's when a held or protected block is skipped.
* ``l1``: the slot map, and T1 with B1 as *one* plain dict (key -> None) beside one
  FIFO of entries ``[B1 oldest .. B1 newest | T1 coldest .. T1 hottest]``: an evicted
  key stays where it is, only the boundary moves (ARC's L1 = T1 + B1 is one LRU list).
  An incoming key is not resident, so "in the dict" means "a B1 ghost".
* ``one``: a single dict per key for the manager and the policy: key -> slot for a
  resident block, key -> ``GHOST`` for a B1 ghost, the same FIFO of entries.

The counted stream has no touches, pins or returning ghosts, so the FIFOs hold no
dead entries: ``ring``, ``l1b``, ``l1`` and ``one`` count a lower bound of what a full
implementation (parking, dead entries after promotions, T2 and B2) would pay here. T2 (the bench's
25,600 reused blocks) is in the slot map but untouched by the stores, as in the bench.

For each layout: ``valgrind --tool=cachegrind`` with ``--stores`` rounds and with none,
per block: instructions, L1 data misses, misses of a simulated 1 MiB last level.
Run from the repository root (deterministic for a given build)::

    nice python benchmarks/manager_table_shapes.py --policy arc --policy slru \
        --out benchmarks/results/manager-table-shapes.json

``--time RUNS`` times each layout instead (CPU ns per block, one process per layout
and run, the layouts alternating; medians and per-run ratios to ``now``, with the load
average); ``--check`` only checks that every layout ends the stream with ``now``'s
blocks, slots and ghosts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import filterfalse, islice, repeat
from pathlib import Path

BLOCKS = 200_000
BATCH = 64
REUSED = 25_600  # the bench's hot blocks: T2 / protected, untouched by the stores
WARM = 400  # untimed store rounds before the counted ones, as in the bench
LAYOUTS = ("now", "ring", "l1b", "l1", "one")
GHOST = object()  # ``one``: the value of a B1 ghost
IN_T1, IN_B1 = object(), object()  # ``l1b``: a key's list


def _key(i: int) -> bytes:
    return i.to_bytes(8, "little")


class _Fifo:
    """A queue in one list allocated up front (growing it would add a realloc's copy,
    whose cost depends on where the allocator puts the list)."""

    __slots__ = ("head", "items", "tail")

    def __init__(self, first: list[bytes], room: int) -> None:
        self.items: list[bytes | None] = [*first, *([None] * room)]
        self.head = 0  # the oldest entry
        self.tail = len(first)  # one past the newest

    def __len__(self) -> int:
        return self.tail - self.head

    def push(self, batch: list[bytes]) -> None:
        tail = self.tail
        self.items[tail : tail + len(batch)] = batch
        self.tail = tail + len(batch)

    def take(self, n: int, at: int | None = None) -> list[bytes]:
        """The ``n`` entries from ``at`` (default: the oldest), their slots freed."""
        at = self.head if at is None else at
        out = self.items[at : at + n]
        self.items[at : at + n] = [None] * n
        if at == self.head:
            self.head = at + n
        return out  # type: ignore[return-value]


State = Callable[[], tuple[dict[bytes, object], set[bytes]]]
"""A layout's resident blocks (key -> slot) and B1's ghosts, for ``--check``."""


def _stream(layout: str, ghost_cap: int, room: int) -> tuple[Callable[[list[bytes]], None], State]:
    """The per-round store function of ``layout`` over a full tier (``room``: keys
    that the rounds will add), and its state."""
    cold = [_key(i) for i in range(REUSED, BLOCKS)]  # T1, coldest first
    slots: dict[bytes, object] = {_key(i): i for i in range(BLOCKS)}

    if layout == "now":
        t1: OrderedDict[bytes, None] = OrderedDict.fromkeys(cold)
        b1: set[bytes] = set()
        b1_fifo = _Fifo([], room)  # GhostList's queue: dropped slots set to None

        def store_now(batch: list[bytes]) -> None:
            new = list(filterfalse(slots.__contains__, batch))
            assert b1.isdisjoint(new)  # the incoming ghost test
            victims = list(islice(t1, len(new)))
            free = list(map(slots.pop, victims))
            deque(map(t1.pop, victims), maxlen=0)
            b1.update(victims)
            b1_fifo.push(victims)
            deque(map(slots.setdefault, new, free), maxlen=0)
            deque(map(t1.setdefault, new), maxlen=0)
            if len(b1) > ghost_cap:
                b1.difference_update(b1_fifo.take(BATCH))

        return store_now, lambda: (dict(slots), set(b1))

    if layout in ("ring", "l1b"):
        # T1's order as a FIFO of entries (no dead ones in this stream), B1's its own
        t1_fifo = _Fifo(cold, room)
        b1_fifo = _Fifo([], room)
        members: dict[bytes, object] = dict.fromkeys(cold, IN_T1)
        b1_set: set[bytes] = set()

        def store_split(batch: list[bytes]) -> None:
            new = list(filterfalse(slots.__contains__, batch))
            if layout == "ring":
                assert b1_set.isdisjoint(new)
            else:  # not resident: in ``members`` means a B1 ghost
                assert members.keys().isdisjoint(new)
            victims = t1_fifo.take(len(new))
            free = list(map(slots.pop, victims))
            if layout == "ring":
                deque(map(members.pop, victims), maxlen=0)
                b1_set.update(victims)
            else:  # the victim's record says B1 now: one write, no move
                deque(map(members.__setitem__, victims, repeat(IN_B1)), maxlen=0)
            b1_fifo.push(victims)
            deque(map(slots.setdefault, new, free), maxlen=0)
            deque(map(members.setdefault, new, repeat(IN_T1)), maxlen=0)
            t1_fifo.push(new)
            if len(b1_fifo) > ghost_cap:
                taken = b1_fifo.take(BATCH)
                if layout == "ring":
                    b1_set.difference_update(taken)
                else:
                    deque(map(members.pop, taken), maxlen=0)

        def state_split() -> tuple[dict[bytes, object], set[bytes]]:
            if layout == "ring":
                return dict(slots), set(b1_set)
            return dict(slots), {k for k, v in members.items() if v is IN_B1}

        return store_split, state_split

    # ``l1`` and ``one``: one FIFO [B1 oldest .. B1 newest | T1 coldest .. T1 hottest]
    fifo = _Fifo(cold, room)
    at = {"bound": 0}  # T1's coldest entry; B1 is [head, bound)

    if layout == "l1":
        l1: dict[bytes, None] = dict.fromkeys(cold)

        def store_l1(batch: list[bytes]) -> None:
            new = list(filterfalse(slots.__contains__, batch))
            assert l1.keys().isdisjoint(new)  # not resident: in l1 means a B1 ghost
            bound = at["bound"]
            victims = fifo.items[bound : bound + len(new)]  # stay in place: B1's newest
            at["bound"] = bound + len(new)
            free = list(map(slots.pop, victims))
            deque(map(slots.setdefault, new, free), maxlen=0)
            deque(map(l1.setdefault, new), maxlen=0)
            fifo.push(new)
            if at["bound"] - fifo.head > ghost_cap:
                deque(map(l1.pop, fifo.take(BATCH)), maxlen=0)

        return store_l1, lambda: (dict(slots), set(l1) - slots.keys())

    table: dict[bytes, object] = slots  # one record per key: slot or GHOST

    def store_one(batch: list[bytes]) -> None:
        found = list(map(table.get, batch))
        assert not any(found)  # all new, none a ghost (a ghost would read GHOST)
        bound = at["bound"]
        victims = fifo.items[bound : bound + len(batch)]
        at["bound"] = bound + len(batch)
        free = list(map(table.__getitem__, victims))
        deque(map(table.__setitem__, victims, repeat(GHOST)), maxlen=0)  # ghost in place
        deque(map(table.setdefault, batch, free), maxlen=0)
        fifo.push(batch)
        if at["bound"] - fifo.head > ghost_cap:
            deque(map(table.pop, fifo.take(BATCH)), maxlen=0)

    def state_one() -> tuple[dict[bytes, object], set[bytes]]:
        resident = {k: v for k, v in table.items() if v is not GHOST}
        return resident, {k for k, v in table.items() if v is GHOST}

    return store_one, state_one


def child(layout: str, ghost_cap: int, stores: int, made: int) -> None:
    """The counted process: setup and ``WARM`` rounds, then ``stores`` rounds (of
    ``made`` rounds' keys made beforehand, the same in both runs)."""
    store, _ = _stream(layout, ghost_cap, (WARM + made) * BATCH)
    fresh = iter(range(BLOCKS, BLOCKS + (WARM + made) * BATCH))
    batches = [[_key(next(fresh)) for _ in range(BATCH)] for _ in range(WARM + made)]
    for batch in batches[: WARM + stores]:
        store(batch)
    sys.stdout.flush()
    os._exit(0)


def timed(layout: str, ghost_cap: int, stores: int) -> float:
    """CPU ns per block of ``stores`` rounds after the warm ones, in this process."""
    store, _ = _stream(layout, ghost_cap, (WARM + stores) * BATCH)
    fresh = iter(range(BLOCKS, BLOCKS + (WARM + stores) * BATCH))
    batches = [[_key(next(fresh)) for _ in range(BATCH)] for _ in range(WARM + stores)]
    for batch in batches[:WARM]:
        store(batch)
    start = time.thread_time_ns()
    for batch in batches[WARM:]:
        store(batch)
    return (time.thread_time_ns() - start) / (stores * BATCH)


def check(ghost_cap: int, stores: int) -> None:
    """Every layout ends the same stream with the same blocks in the same slots and
    the same ghosts (each does the same work, only kept differently)."""
    batches = [[_key(BLOCKS + r * BATCH + j) for j in range(BATCH)] for r in range(WARM + stores)]
    states = {}
    for layout in LAYOUTS:
        store, state = _stream(layout, ghost_cap, len(batches) * BATCH)
        for batch in batches:
            store(batch)
        states[layout] = state()
    resident, ghosts = states["now"]
    assert len(resident) == BLOCKS and len(ghosts) == min(ghost_cap, len(batches) * BATCH)
    for layout, (r, g) in states.items():
        assert r == resident, f"{layout}: other resident blocks or slots than now's"
        assert g == ghosts, f"{layout}: other ghosts than now's"


def counts(layout: str, ghost_cap: int, stores: int, made: int) -> dict[str, int]:
    """Cachegrind's totals for one child run."""
    from manager_cachegrind import cachegrind_totals  # not in the measured child

    env = dict(os.environ, PYTHONHASHSEED="0")
    return cachegrind_totals(__file__, [layout, str(ghost_cap), str(stores), str(made)], env)


def per_block(layout: str, ghost_cap: int, stores: int) -> dict[str, float]:
    """Counts of ``stores`` rounds less those of none, per stored+evicted block."""
    full = counts(layout, ghost_cap, stores, stores)
    empty = counts(layout, ghost_cap, 0, stores)
    from manager_cachegrind import misses_per_block

    return misses_per_block(full, empty, stores * BATCH)


GHOST_CAPS = {"arc": REUSED, "slru": 4 * BLOCKS}
"""Ghosts kept: ARC's B1 within |T1| + |B1| <= c (T1 holds all but the reused blocks);
slru's 4 x capacity, which the bench's stores never reach."""


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    if sys.argv[1:2] == ["--timed-child"]:
        print(timed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", choices=sorted(GHOST_CAPS), required=True)
    parser.add_argument("--layout", action="append", choices=LAYOUTS)
    parser.add_argument("--stores", type=int, default=800, help="counted store rounds")
    parser.add_argument(
        "--time",
        type=int,
        default=0,
        metavar="RUNS",
        help="instead of counting, time each layout RUNS times (alternating, one process each)",
    )
    parser.add_argument(
        "--check", action="store_true", help="only check that the layouts end alike"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.check:
        for policy in args.policy:
            check(GHOST_CAPS[policy], args.stores)
            print(f"{policy}: every layout ends with now's blocks, slots and ghosts")
        return
    if args.time:
        time_layouts(args)
        return
    results: dict[str, dict[str, dict[str, float]]] = {}
    for policy in args.policy:
        for layout in args.layout or LAYOUTS:
            r = per_block(layout, GHOST_CAPS[policy], args.stores)
            results.setdefault(policy, {})[layout] = r
            print(
                f"{policy:<6}{layout:<5} {r['instructions']:>6} instr "
                f"{r['d1_misses']:>6} L1d {r['l2_misses_1MiB']:>6} 1MiB-misses",
                flush=True,
            )
    if args.out:
        from manager_cachegrind import VALGRIND, git_head

        doc = {
            "benchmark": "manager_table_shapes",
            "commit": git_head(),
            "configuration": {
                "blocks": BLOCKS,
                "batch": BATCH,
                "reused": REUSED,
                "warm": WARM,
                "stores": args.stores,
                "ghost_caps": GHOST_CAPS,
                "python": sys.version.split()[0],
                "valgrind": " ".join(VALGRIND),
            },
            "per_block": results,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


def time_layouts(args: argparse.Namespace) -> None:
    """CPU ns per block of each layout, ``args.time`` runs alternating; medians and the
    median of per-run ratios to ``now``, with the load average of each run."""
    layouts = args.layout or LAYOUTS
    runs: list[dict[str, object]] = []
    for r in range(args.time):
        for policy in args.policy:
            for layout in layouts:
                load = os.getloadavg()[0]
                cmd = [sys.executable, __file__, "--timed-child", layout]
                cmd += [str(GHOST_CAPS[policy]), str(args.stores)]
                env = dict(os.environ, PYTHONHASHSEED="0")
                out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                ns = float(out.stdout)
                runs.append({"run": r, "policy": policy, "layout": layout, "load": load, "ns": ns})
                print(f"run {r} {policy:<5} {layout:<5} load {load:.2f} {ns:.0f} ns", flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for policy in args.policy:
        base = [x["ns"] for x in runs if x["policy"] == policy and x["layout"] == "now"]
        for layout in layouts:
            ns = [x["ns"] for x in runs if x["policy"] == policy and x["layout"] == layout]
            row = {"median_ns": round(statistics.median(ns))}  # type: ignore[type-var]
            if base:
                row["ratio_to_now"] = round(
                    statistics.median(b / a for a, b in zip(base, ns, strict=True)),
                    3,  # type: ignore[operator]
                )
            summary.setdefault(policy, {})[layout] = row
            print(f"{policy:<5} {layout:<5} {row}")
    loads = [float(x["load"]) for x in runs]  # type: ignore[arg-type]
    print(f"load average (1 min): {min(loads):.2f}-{max(loads):.2f}")
    if args.out:
        from manager_cachegrind import git_head

        doc = {
            "benchmark": "manager_table_shapes --time",
            "commit": git_head(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "configuration": {"blocks": BLOCKS, "batch": BATCH, "stores": args.stores},
            "load_average_1min": {"min": min(loads), "max": max(loads)},
            "cpu_ns_per_block": summary,
            "runs": runs,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
