"""Screen prototype eviction policies on issue 14's cells, against ``policy_cells.json``.

Prototypes that are not switchers among LRU/ARC/SLRU shadows, kept here (not in
``src/``) because none met issue 14; each is registered in ``POLICIES`` in the worker
processes only, and replayed through the real manager (``kvtier.sim.replay``) on the
workloads and capacities of ``policy_cells.py``. Prints per workload the hit blocks
minus max(lru, arc) and minus the shipped ``leader``'s (both read from the JSON, which
must come from a cell run of the same lru/arc code). Run from the repository root::

    PYTHONPATH=src nice python benchmarks/prefix_screen.py abranch_0.5_3_0 [CELLS_JSON] \
        [--only=synthetic,chat_seed1] [--out=benchmarks/results/prefix-screen-....json]

``--cost``: instead, the paired per-block manager cost of the variant against ``lru``
(``manager_pair_ab.measure``: 200,000 blocks, none pinned, 8 rounds); ``observe_4``
is LRU plus the structure learning alone.

``CELLS_JSON`` (default ``benchmarks/results/policy_cells.json``): the cell run to
compare with, e.g. ``policy-cells-leader-seeds45-20261123T2019Z.json`` for the held-out
seeds 4 and 5. Prototypes, ``<name>_<p1>_<p2>...`` (the parameters in the order of the
class's ``PARAMS``; those left out keep their defaults). They keep what they learn of
the prefix structure for every key ever looked up (unbounded: a screen, not a policy):

* ``branch_<f>``: LRU with the blocks of *shared* prefixes protected up to a share
  ``f`` of the tier. A key is shared once two requests have shown it two different
  next keys (a branching point), and so is every key before it in such a request: a
  system or tool prompt that several conversations continue, not one conversation's
  history (each of its keys has one next key). Victims come from the unshared LRU
  list first, from the shared one while it holds more than ``f`` of the tier (or
  when the unshared list has nothing evictable): over its share, the older of the two
  lists' coldest blocks goes (LRU between them). ``branch_<f>_<k>``: a key is a
  branching point once it has shown ``k`` different next keys.
* ``over_<inner>_<f>_<k>``: the shared list beside a real ``inner`` policy (lru, arc,
  slru) holding the other blocks; over its share the shared list's coldest go first.
* ``abranch_<f>_<k>_<reuse>_<ghost>``: ``branch`` whose share is a target adapted as
  ARC adapts T1's, from ghosts of the two lists (``f``: its start); ``reuse`` = 1 also
  moves a reused block to the shared list, ``ghost`` = 1 a re-stored ghost.
* ``nbranch_<f>_<k>_<q>_<move>_<merge>_<pgn>``: ``abranch`` plus a probation list N
  for the blocks stored by requests whose first key was never looked up before (a new
  root), evicted first while over an ARC-style target (``q``: its start, a share);
  ``move`` = 1: a reuse takes a block out of N; ``merge`` = 1: under the target N
  competes with the others by last use; ``pgn`` = 1: N's ghosts also lower ``f``.
* ``lead_<a>.<b>...``: the shipped ``leader`` with these shadows (registered names or
  prototypes; the shadows are shown each lookup through ``observe``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policy_cells as pc

from kvtier.bench.report import git_commit, machine_info
from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import POLICIES
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.sim.replay import replay


def learn_shared(
    keys: Sequence[BlockHash],
    kids: dict[BlockHash, set[BlockHash]],
    shared: set[BlockHash],
    need: int,
) -> list[BlockHash]:
    """Learn one lookup's prefix structure: record each key's next key (up to ``need``
    different ones), and mark as shared every key up to the deepest branching point
    (a key with ``need`` next keys, or one already shared). Returns the keys it newly
    marked, in request order."""
    deepest = -1
    for i in range(len(keys) - 1):
        key = keys[i]
        seen = kids.setdefault(key, set())
        if len(seen) < need:
            seen.add(keys[i + 1])
        if len(seen) >= need or key in shared:
            deepest = i
    new = [key for key in keys[: deepest + 1] if key not in shared]
    shared.update(new)
    return new


class BranchLRU(EvictionPolicy):
    """LRU with shared-prefix blocks protected up to ``SHARE`` of the tier."""

    name = "branch"
    PARAMS = ("SHARE", "KIDS")
    SHARE = 0.25
    KIDS = 2

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.u: OrderedDict[BlockHash, None] = OrderedDict()
        self.s: OrderedDict[BlockHash, None] = OrderedDict()
        self.kids: dict[BlockHash, set[BlockHash]] = {}
        self.shared: set[BlockHash] = set()
        self.stamp: dict[BlockHash, int] = {}
        self.clock = 0

    def __len__(self) -> int:
        return len(self.u) + len(self.s)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        for key in learn_shared(keys, self.kids, self.shared, self.KIDS):
            if key in self.u:
                del self.u[key]
                self.s[key] = None

    def _list(self, key: BlockHash) -> OrderedDict[BlockHash, None]:
        return self.s if key in self.shared else self.u

    def add(self, key: BlockHash) -> None:
        self._list(key)[key] = None
        self.clock += 1
        self.stamp[key] = self.clock

    def touch(self, key: BlockHash, reused: bool) -> None:
        lst = self.s if key in self.s else self.u
        lst.move_to_end(key)
        self.clock += 1
        self.stamp[key] = self.clock

    def remove(self, key: BlockHash) -> None:
        self.u.pop(key, None)
        self.s.pop(key, None)
        self.stamp.pop(key, None)

    def release(self, key: BlockHash) -> None:
        pass

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        limit = self.SHARE * self.capacity
        s_left = len(self.s)
        su = iter(self.u)
        ss = iter(self.s)
        victims: list[BlockHash] = []
        cu = next((k for k in su if not is_held(k) and k not in protected), None)
        cs = next((k for k in ss if not is_held(k) and k not in protected), None)
        stamp = self.stamp
        while len(victims) < n:
            # over its share, the shared list competes by last use; else it is spared
            take_s = cu is None or (s_left > limit and cs is not None and stamp[cs] < stamp[cu])
            if take_s:
                if cs is None:
                    return None
                victims.append(cs)
                s_left -= 1
                cs = next((k for k in ss if not is_held(k) and k not in protected), None)
            else:
                victims.append(cu)
                cu = next((k for k in su if not is_held(k) and k not in protected), None)
        return victims

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            self.remove(key)


class BranchOver(EvictionPolicy):
    """Shared-prefix blocks in a protected LRU list of at most ``SHARE`` of the tier,
    the others in a real ``INNER`` policy (``lru``, ``arc``, ``slru``) of the tier's
    capacity; over its share the protected list's coldest go first."""

    name = "over"
    PARAMS = ("INNER", "SHARE", "KIDS")
    INNER = "arc"
    SHARE = 0.5
    KIDS = 3

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.inner = POLICIES[self.INNER](capacity)
        self.s: OrderedDict[BlockHash, None] = OrderedDict()
        self.kids: dict[BlockHash, set[BlockHash]] = {}
        self.shared: set[BlockHash] = set()
        self.resident: set[BlockHash] = set()

    def __len__(self) -> int:
        return len(self.resident)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        for key in learn_shared(keys, self.kids, self.shared, self.KIDS):
            if key in self.resident:
                self.inner.remove(key)
                self.s[key] = None
        self.inner.observe(keys)

    def add(self, key: BlockHash) -> None:
        self.resident.add(key)
        if key in self.shared:
            self.s[key] = None
        else:
            self.inner.add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.s:
            self.s.move_to_end(key)
        else:
            self.inner.touch(key, reused)

    def remove(self, key: BlockHash) -> None:
        self.resident.discard(key)
        if self.s.pop(key, 0) is not None:
            self.inner.remove(key)

    def release(self, key: BlockHash) -> None:
        if key not in self.s:
            self.inner.release(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        over = max(0, len(self.s) - int(self.SHARE * self.capacity))
        free = list(islice((k for k in self.s if not is_held(k) and k not in protected), n))
        take = min(n, over, len(free))
        rest = n - take
        inner: list[BlockHash] | None = []
        if rest:
            inner = self.inner.choose_victims(rest, is_held, protected, incoming)
            if inner is None:  # the inner list has too few: more from the protected one
                have = len(self.resident) - len(self.s)
                some = self.inner.choose_victims(have, is_held, protected, incoming)
                inner = (some or []) if have else []
                take = n - len(inner)
                if take > len(free):
                    return None
        return free[:take] + inner

    def evict(self, victims: Sequence[BlockHash]) -> None:
        inner = []
        for key in victims:
            self.resident.discard(key)
            if self.s.pop(key, 0) is not None:
                inner.append(key)
        if inner:
            self.inner.evict(inner)


class AdaptiveBranch(BranchLRU):
    """``branch`` whose share is a target ``p`` adapted as ARC adapts T1's: a stored
    key that the unshared list evicted lately (a ghost of it) lowers ``p``, one that
    the shared list evicted raises it, by max(1, other ghosts / these ghosts); ghosts
    of at most the tier's capacity each; ``p`` starts at ``SHARE`` of the tier."""

    name = "abranch"
    PARAMS = ("SHARE", "KIDS", "REUSE", "GHOST")
    SHARE = 0.5
    KIDS = 3
    REUSE = 0  # 1: a reuse (a touch of a ready block) also moves a block to the shared list
    GHOST = 0  # 1: a re-stored ghost (of either list) enters the shared list

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = self.SHARE * capacity
        self.gu: OrderedDict[BlockHash, None] = OrderedDict()
        self.gs: OrderedDict[BlockHash, None] = OrderedDict()

    def add(self, key: BlockHash) -> None:
        gu, gs = self.gu, self.gs
        ghost = False
        if key in gu:
            del gu[key]
            ghost = True
            self.p = max(0.0, self.p - max(1.0, len(gs) / (len(gu) + 1)))
        elif key in gs:
            del gs[key]
            ghost = True
            self.p = min(float(self.capacity), self.p + max(1.0, len(gu) / (len(gs) + 1)))
        if ghost and self.GHOST:
            self.s[key] = None
            self.clock += 1
            self.stamp[key] = self.clock
        else:
            super().add(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        self.SHARE = self.p / self.capacity
        return super().choose_victims(n, is_held, protected, incoming)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if reused and self.REUSE and key in self.u:
            del self.u[key]
            self.s[key] = None
            self.clock += 1
            self.stamp[key] = self.clock
        else:
            super().touch(key, reused)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            ghosts = self.s if key in self.s else None
            ghost = self.gs if ghosts is not None else self.gu
            ghost[key] = None
            if len(ghost) > self.capacity:
                ghost.popitem(last=False)
        super().evict(victims)


class NovelBranch(AdaptiveBranch):
    """``abranch`` plus a probation list N for the blocks stored by requests whose
    first key was never looked up before (a new root: a pasted document, not a turn
    of a known conversation or prompt). N's coldest go first while N holds more than
    a target ``q``, adapted as ARC's: a re-stored ghost of N raises ``q``, one of the
    other two lists lowers it. A reuse moves an N block to the unshared list."""

    name = "nbranch"
    PARAMS = ("SHARE", "KIDS", "QSHARE", "MOVE", "MERGE", "PGN", "CHAIN")
    CHAIN = 0  # 1: a block whose parent (the key before it in the request) is in N joins N
    PGN = 0  # 1: a re-stored ghost of N also lowers the shared list's target p
    QSHARE = 0.0
    MOVE = 1  # 0: a reuse keeps an N block in N (made the most recent there)
    MERGE = 0  # 1: under its target, N's coldest compete with the others' victims by last use

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.n: OrderedDict[BlockHash, None] = OrderedDict()
        self.gn: OrderedDict[BlockHash, None] = OrderedDict()
        self.q = self.QSHARE * capacity
        self.roots: set[BlockHash] = set()
        self.novel = False
        self.parent: dict[BlockHash, BlockHash] = {}

    def __len__(self) -> int:
        return super().__len__() + len(self.n)

    def observe(self, keys: Sequence[BlockHash]) -> None:
        self.novel = bool(keys) and keys[0] not in self.roots
        self.parent = dict(zip(keys[1:], keys, strict=False)) if self.CHAIN else {}
        if keys:
            self.roots.add(keys[0])
        super().observe(keys)
        shared = self.shared
        for key in [k for k in keys if k in self.n and k in shared]:
            del self.n[key]
            self.s[key] = None

    def add(self, key: BlockHash) -> None:
        gn = self.gn
        others = len(self.gu) + len(self.gs)
        if key in gn:
            del gn[key]
            self.q = min(float(self.capacity), self.q + max(1.0, others / (len(gn) + 1)))
            if self.PGN:
                self.p = max(0.0, self.p - max(1.0, len(self.gs) / (len(self.gu) + len(gn) + 1)))
        elif key in self.gu or key in self.gs:
            self.q = max(0.0, self.q - max(1.0, len(gn) / (others + 1)))
        if (self.novel or self.parent.get(key) in self.n) and key not in self.shared:
            self.n[key] = None
            self.clock += 1
            self.stamp[key] = self.clock
            return
        super().add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self.n:
            if reused and self.MOVE:
                del self.n[key]
                self.u[key] = None
            else:
                self.n.move_to_end(key)
            self.clock += 1
            self.stamp[key] = self.clock
        else:
            super().touch(key, reused)

    def remove(self, key: BlockHash) -> None:
        self.n.pop(key, None)
        super().remove(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        over = int(len(self.n) - self.q)
        first: list[BlockHash] = []
        if over > 0:
            free = (k for k in self.n if not is_held(k) and k not in protected)
            first = list(islice(free, min(n, over)))
        rest = n - len(first)
        if not rest:
            return first
        skip = set(first)
        more = (k for k in self.n if k not in skip and not is_held(k) and k not in protected)
        mine = list(islice(more, rest))
        theirs: list[BlockHash] | None = None
        if len(self.u) + len(self.s):
            theirs = super().choose_victims(rest, is_held, protected, incoming)
        if theirs is None:
            return first + mine if len(mine) == rest else None
        if not self.MERGE:
            return first + theirs
        # under its target, N competes with the others by last use
        stamp = self.stamp
        merged = sorted(mine + theirs, key=stamp.__getitem__)[:rest]
        return first + merged

    def evict(self, victims: Sequence[BlockHash]) -> None:
        rest = []
        for key in victims:
            if key in self.n:
                del self.n[key]
                self.stamp.pop(key, None)
                self.gn[key] = None
                if len(self.gn) > self.capacity:
                    self.gn.popitem(last=False)
            else:
                rest.append(key)
        if rest:
            super().evict(rest)


class ObserveLRU(LRUPolicy):
    """LRU plus the structure learning of ``branch``'s ``observe`` (next keys seen after
    each key, branching points, first keys): its lookup cost, for ``--cost``."""

    name = "observe"
    PARAMS = ("KIDS",)
    KIDS = 4

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.kids: dict[BlockHash, set[BlockHash]] = {}
        self.shared: set[BlockHash] = set()
        self.roots: set[BlockHash] = set()

    def observe(self, keys: Sequence[BlockHash]) -> None:
        if keys:
            self.roots.add(keys[0])
        learn_shared(keys, self.kids, self.shared, self.KIDS)


PROTOTYPES: dict[str, type[EvictionPolicy]] = {
    "observe": ObserveLRU,
    "nbranch": NovelBranch,
    "branch": BranchLRU,
    "over": BranchOver,
    "abranch": AdaptiveBranch,
}


def _register(variant: str) -> None:
    if variant.startswith("lead_"):  # leader with these shadows: lead_lru.arc.abranch
        _lead(variant)
        return
    name, *params = variant.split("_")
    cls = PROTOTYPES[name]
    for attr, param in zip(cls.PARAMS, params, strict=False):  # type: ignore[attr-defined]
        setattr(cls, attr, type(getattr(cls, attr))(param))
    POLICIES[variant] = cls  # before the first replay: an inner policy is looked up


def _lead(variant: str) -> None:
    from kvtier.scheduler.policies import leader

    names = variant.removeprefix("lead_").split(".")
    for name in names:
        if name in PROTOTYPES:
            _register(name)
    leader.CANDIDATES = tuple(POLICIES[name] for name in names)
    request = leader._Shadow.request

    def observed(self, keys):  # type: ignore[no-untyped-def]
        self.policy.observe(keys)  # the prototypes learn from it; lru/arc/slru ignore it
        return request(self, keys)

    leader._Shadow.request = observed  # type: ignore[method-assign]
    POLICIES[variant] = leader.LeaderPolicy


def _job(args: tuple[str, str]) -> tuple[str, list[int]]:
    workload, variant = args
    _register(variant)
    trace = pc._trace(workload)
    caps = [round(share * trace.num_distinct_blocks) for share in pc.SHARES]
    return workload, [replay(trace, cap, variant).ratios.hit_blocks for cap in caps]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    out = [Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--out=")]
    variant = args[0]
    if "--cost" in sys.argv:  # paired manager cost against lru (manager_pair_ab.py)
        import manager_pair_ab

        _register(variant)
        for op, r in manager_pair_ab.measure(variant, "lru", 200_000, 0, 8).items():
            assert isinstance(r, dict)
            print(
                f"{op:<12} {variant} {r[variant]:7.0f}  lru {r['lru']:7.0f} ns/block CPU, "
                f"paired ratio {r['ratio']:.2f}"
            )
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    cells = args[1] if len(args) > 1 else "benchmarks/results/policy_cells.json"
    doc = json.loads(Path(cells).read_text())
    rows = {row["workload"]: row for row in doc["rows"]}
    names = [w for w in rows if not only or w in only[0]]
    start = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(_job, [(w, variant) for w in names]))
    counts = [0, 0, 0]
    lead = [0, 0, 0]
    for workload, hits in results:
        ref = rows[workload]["hit_blocks"]
        best = [max(a, b) for a, b in zip(ref["lru"], ref["arc"], strict=True)]
        diffs = [h - b for h, b in zip(hits, best, strict=True)]
        for d in diffs:
            counts[0 if d > 0 else 1 if d == 0 else 2] += 1
        line = f"{workload:>16}: vs max(lru, arc) {diffs}"
        if "leader" in ref:
            vs = [h - b for h, b in zip(hits, ref["leader"], strict=True)]
            line += f"  vs leader {vs}"
            for d in vs:
                lead[0 if d > 0 else 1 if d == 0 else 2] += 1
        print(line, flush=True)
    load = os.getloadavg()
    print(
        f"{variant}: above {counts[0]}, equal {counts[1]}, below {counts[2]} "
        f"(vs leader {lead[0]}/{lead[1]}/{lead[2]}); "
        f"{time.perf_counter() - start:.0f} s, load average {load[0]:.2f}"
    )
    if out:
        doc = {
            "benchmark": "prefix_screen",
            "machine": machine_info(),
            "commit": git_commit(),
            "load_average": load,
            "configuration": {"variant": variant, "cells": cells, "shares": pc.SHARES},
            "hit_blocks": dict(results),
            "summary": {"above": counts[0], "equal": counts[1], "below": counts[2]},
        }
        out[0].write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
