"""``density`` or ``leader`` with one of ``density``'s parts changed, on issue 14's cells.

Replays the policy with module constants set in the worker processes, on the workloads
and capacities of ``policy_cells.py``, and prints per workload the hit blocks minus
max(lru, arc) (read from a cell run of the same lru/arc code), then the cell counts.
Variants, joined by ``+`` for several at once:

* ``prior_<x>``: ``hit_density.PRIOR_EVENTS`` (``prior_0``: no shrinkage toward the
  pool -- and a class with no events of its own then has an all-zero table);
* ``dead_<x>``: ``hit_density.DEAD_SHARE``;
* ``decay_<x>``: ``hit_density.DECAY``;
* ``depths_1``, ``tails_1``: a chain class without the hit depth or the tail bit;
* ``update_<n>``: ``density.UPDATE_KEYS``; ``bucket_<n>``: ``density.BUCKET_SHARE``;
* ``history_<n>``: ``density.HISTORY``;
* ``start_<i>``: ``leader.START`` (with ``--policy leader``; 4 is density, and then a
  sampled tier runs a density shadow too: ``leader.IN_STEP_ONLY`` emptied);
* ``tie_<i>``: the tier follows candidate ``i`` while every shadow has hit alike (a
  sampled tier without that shadow: ``START``), and after the first request on which
  they differ, the one that hit most in it (the one followed, if it is among them);
  then the shipped rule;
* ``mini_<f>``: while every shadow has hit alike, the tier follows the candidate whose
  *small* shadow (``f`` of the tier's size, one per candidate, in step only) has hit
  most so far (the one followed on a tie); then the shipped rule;
* ``vote``: while every shadow has hit alike, the tier's victims are the blocks the
  fewest shadows hold, least recently used first among as many (in step only); at the
  first request on which they differ, an in-step tier that follows the one that hit
  most in it (the one followed, if it is among them) takes the blocks in their order
  of use; then the shipped rule.

* ``reserve_<f>``, ``treserve_<f>``, ``breserve_<f>``, ``greserve_<f>``: the leader's
  reserve (``leader.RESERVE``, shipped in the fourteenth round at 0.03 with the
  ``greserve`` rule) at ``f`` of the tier, given up at the first switch and: never
  (``reserve``), at the first request on which the shadows differ (``treserve``), on
  which some shadow hits more than the leader (``breserve``), on which ARC, SLRU or
  the tier hits less than the leader (``greserve``, as shipped); ``rscan_<n>``:
  ``leader.RESERVE_SCAN`` (the ``treserve_0.01`` run in ``docs/simulate.md`` was
  ``treserve_0.01+rscan_4``).

(``nohedge``, the leader's hedge never followed, went with the hedge; ``8dfc987``'s
copy has it.)

Run from the repository root::

    PYTHONPATH=src nice python benchmarks/density_variants.py prior_0 CELLS_JSON \
        [--policy leader] [--seeds 4,5] [--out benchmarks/results/....json]

``CELLS_JSON``: a ``policy_cells.py`` run of the same seeds (its lru and arc rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policy_cells as pc

from kvtier.bench.report import git_commit, machine_info
from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import density, hit_density, leader
from kvtier.scheduler.policies.base import EvictionPolicy, IsHeld
from kvtier.scheduler.policies.recency import RecencyList
from kvtier.scheduler.policies.segmented import SegmentedPolicy
from kvtier.sim.replay import replay

_SETTINGS = {
    "prior": (hit_density, "PRIOR_EVENTS", float),
    "dead": (hit_density, "DEAD_SHARE", float),
    "decay": (hit_density, "DECAY", float),
    "depths": (density, "DEPTHS", int),
    "tails": (density, "TAILS", int),
    "update": (density, "UPDATE_KEYS", int),
    "bucket": (density, "BUCKET_SHARE", int),
    "history": (density, "HISTORY", int),
    "start": (leader, "START", int),
    "rscan": (leader, "RESERVE_SCAN", int),
}


def _follow_while_tied(first: int) -> None:
    """``tie_<i>`` (see the module's doc)."""
    init, observe = leader.LeaderPolicy.__init__, leader.LeaderPolicy.observe

    def tied_init(self: leader.LeaderPolicy, capacity: int) -> None:
        init(self, capacity)
        self._tied = first < len(self._shadows)  # type: ignore[attr-defined]
        if self._tied:  # type: ignore[attr-defined]
            self._leader = first
            self._tier.lead(self._shadows[first])

    def tied_observe(self: leader.LeaderPolicy, keys: list[bytes]) -> None:
        observe(self, keys)  # type: ignore[arg-type]
        # The first difference leaves a square (this window) or, if it ended the
        # window, a spread; the scores then rank the shadows by their hits in it.
        if self._tied and _first_difference(self):  # type: ignore[attr-defined]
            self._tied = False  # type: ignore[attr-defined]
            scores = self._decayed()
            if scores[self._leader] < max(scores):
                self._leader = scores.index(max(scores))
                self._tier.lead(self._shadows[self._leader])

    leader.LeaderPolicy.__init__ = tied_init  # type: ignore[method-assign]
    leader.LeaderPolicy.observe = tied_observe  # type: ignore[method-assign,assignment]


def _first_difference(policy: leader.LeaderPolicy) -> bool:
    """Whether the shadows have hit differently on some request: it leaves a square
    (this window) or, if it ended the window, a spread."""
    return any(policy._squares) or any(policy._spreads)


def _follow_small_while_tied(share: float) -> None:
    """``mini_<f>`` (see the module's doc)."""
    init, observe = leader.LeaderPolicy.__init__, leader.LeaderPolicy.observe

    def mini_init(self: leader.LeaderPolicy, capacity: int) -> None:
        init(self, capacity)
        small = int(capacity * share) if self._mask == 0 else 0  # in step only
        self._minis = (  # type: ignore[attr-defined]
            [leader._Shadow(type(shadow.policy), small) for shadow in self._shadows]
            if small > 0
            else None
        )

    def mini_observe(self: leader.LeaderPolicy, keys: list[bytes]) -> None:
        minis = self._minis  # type: ignore[attr-defined]
        if minis is None or not keys:
            observe(self, keys)  # type: ignore[arg-type]
            return
        for mini in minis:
            mini.request(keys)
        observe(self, keys)  # type: ignore[arg-type]
        if _first_difference(self):
            self._minis = None  # type: ignore[attr-defined]
            return
        hits = [mini.hits for mini in minis]
        best = hits.index(max(hits))
        if hits[best] > hits[self._leader]:
            self._leader = best
            self._tier.lead(self._shadows[best])

    leader.LeaderPolicy.__init__ = mini_init  # type: ignore[method-assign]
    leader.LeaderPolicy.observe = mini_observe  # type: ignore[method-assign,assignment]


Moved = Callable[[Sequence[BlockHash], Sequence[BlockHash]], None]


class _VoteTier(SegmentedPolicy):
    """``vote``'s tier: one recency list per number of shadows holding the block."""

    learns = False

    def __init__(self, capacity: int, shadows: Sequence[_VotingShadow]) -> None:
        self._shadows = shadows
        for shadow in shadows:
            shadow.moved = self.moved
        self._lists = [RecencyList[BlockHash]() for _ in range(len(shadows) + 1)]
        super().__init__(capacity, self._lists)
        self._count: dict[BlockHash, int] = {}
        self._used = RecencyList[BlockHash]()  # every block, by last use

    def moved(self, evicted: Sequence[BlockHash], stored: Sequence[BlockHash]) -> None:
        """A shadow evicted and stored these keys."""
        for keys, step in ((evicted, -1), (stored, 1)):
            for key in keys:
                count = self._count.get(key)
                if count is not None:
                    self._lists[count].transfer([key], self._lists[count + step])
                    self._count[key] = count + step

    def follow(self, evicted: Sequence[BlockHash], stored: Sequence[BlockHash]) -> None:
        """Every shadow's moves arrive through ``moved``."""

    def add(self, key: BlockHash) -> None:
        count = self._count[key] = sum(key in shadow.resident for shadow in self._shadows)
        self._lists[count].add(key)
        self._used.add(key)

    def touch(self, key: BlockHash, reused: bool) -> None:
        if key in self._count:
            self._lists[self._count[key]].touch(key)
            self._used.touch(key)

    def remove(self, key: BlockHash) -> None:
        self._lists[self._count.pop(key)].remove(key)
        self._used.remove(key)

    def release(self, key: BlockHash) -> None:
        self._lists[self._count[key]].release(key)
        self._used.release(key)

    def release_all(self, keys: Sequence[BlockHash]) -> None:
        for key in keys:
            if key in self._count:
                self.release(key)

    def choose_victims(
        self,
        n: int,
        is_held: IsHeld,
        protected: Collection[BlockHash],
        incoming: Sequence[BlockHash],
    ) -> list[BlockHash] | None:
        return self._coldest_in_order(n, is_held, protected, self._lists)

    def evict(self, victims: Sequence[BlockHash]) -> None:
        for key in victims:
            self.remove(key)

    def in_step(self, capacity: int, lead: leader._Shadow) -> leader._InStep:
        """An in-step tier following ``lead`` with these blocks, in their order of use;
        the shadows stop reporting their moves."""
        for shadow in self._shadows:
            shadow.moved = None
        tier = leader._InStep(capacity, lead)
        for key in self._used.ordered():
            tier.add(key)
        return tier


class _VotingShadow(leader._Shadow):
    """A shadow that reports its moves to ``moved`` (while the vote lasts)."""

    __slots__ = ("moved",)

    def __init__(self, cls: type[EvictionPolicy], capacity: int) -> None:
        super().__init__(cls, capacity)
        self.moved: Moved | None = None

    def request(
        self, keys: Sequence[BlockHash], backwards: Sequence[BlockHash] | None = None
    ) -> tuple[list[BlockHash], list[BlockHash]]:
        evicted, stored = super().request(keys, backwards)
        if self.moved is not None and (evicted or stored):
            self.moved(evicted, stored)
        return evicted, stored


def _vote_while_tied() -> None:
    """``vote`` (see the module's doc)."""
    init, observe = leader.LeaderPolicy.__init__, leader.LeaderPolicy.observe

    def vote_init(self: leader.LeaderPolicy, capacity: int) -> None:
        init(self, capacity)
        if self._mask == 0:
            shadows = tuple(_VotingShadow(type(s.policy), capacity) for s in self._shadows)
            self._shadows, self._tier = shadows, _VoteTier(capacity, shadows)  # type: ignore[assignment]

    def vote_observe(self: leader.LeaderPolicy, keys: list[bytes]) -> None:
        tier = self._tier
        if not isinstance(tier, _VoteTier) or not keys:
            observe(self, keys)  # type: ignore[arg-type]
            return
        before = [shadow.hits for shadow in self._shadows]
        left = self._left
        observe(self, keys)  # type: ignore[arg-type]
        if not _first_difference(self):
            return
        if self._left > left - len(keys):  # it ended a window: the scores rank this request
            scores = self._scores
        else:
            scores = [s.hits - b for s, b in zip(self._shadows, before, strict=True)]
        best = scores.index(max(scores))
        if scores[best] > scores[self._leader]:
            self._leader = best
        self._tier = tier.in_step(self.capacity, self._shadows[self._leader])

    leader.LeaderPolicy.__init__ = vote_init  # type: ignore[method-assign]
    leader.LeaderPolicy.observe = vote_observe  # type: ignore[method-assign,assignment]


def _reserve(share: float, until: str) -> None:
    """``reserve_<f>`` and kin (see the module's doc): the shipped reserve
    (``leader.RESERVE``) at ``share``, given up by the rule named (``until``) and, as
    shipped, at the first switch."""
    leader.RESERVE = share
    if until == "guards":
        return  # the shipped rule
    observe = leader.LeaderPolicy._observe  # the shadows served, followed, decided

    def reserve_observe(self: leader.LeaderPolicy, keys: list[bytes]) -> None:
        tier = self._tier
        if not keys or not tier.reserve:
            observe(self, keys)  # type: ignore[arg-type]
            return
        assert isinstance(tier, leader._InStep)
        lead = self._leader
        observe(self, keys)  # type: ignore[arg-type]
        gains = self._gains  # None: every shadow hit every key
        if until == "tie":
            done = _first_difference(self)
        elif until == "beaten":
            done = gains is not None and max(gains) > gains[lead]
        else:
            done = False
        if done:
            tier.drop_reserve()

    leader.LeaderPolicy.observe = reserve_observe  # type: ignore[method-assign,assignment]


_RESERVES = {"reserve": "switch", "treserve": "tie", "breserve": "beaten", "greserve": "guards"}
"""The ``reserve_<f>`` variants: until when the reserve is kept (besides a switch)."""

_PATCHED: set[str] = set()
"""The variants this process has patched in (a worker runs several jobs, and a wrapping
patch applied twice would wrap itself)."""


def _patch(variants: str) -> None:
    if variants in _PATCHED:
        return
    _PATCHED.add(variants)
    for variant in variants.split("+"):
        name, _, value = variant.partition("_")
        if name == "tie" and value:
            _follow_while_tied(int(value))
            continue
        if name == "mini" and value:
            _follow_small_while_tied(float(value))
            continue
        if name in _RESERVES and value:
            _reserve(float(value), _RESERVES[name])
            continue
        if name == "vote" and not value:
            _vote_while_tied()
            continue
        if name not in _SETTINGS or not value:
            raise SystemExit(f"unknown variant {variant!r}")
        module, attr, kind = _SETTINGS[name]
        setattr(module, attr, kind(value))
        if name == "start" and leader.CANDIDATES[leader.START] in leader.IN_STEP_ONLY:
            leader.IN_STEP_ONLY = ()


def _job(args: tuple[str, str, str]) -> tuple[str, list[int]]:
    workload, variants, policy = args
    _patch(variants)
    trace = pc._trace(workload)
    caps = [round(share * trace.num_distinct_blocks) for share in pc.SHARES]
    return workload, [replay(trace, cap, policy).ratios.hit_blocks for cap in caps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants")
    parser.add_argument("cells", type=Path)
    parser.add_argument("--policy", default="density")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the hit blocks and counts as JSON")
    args = parser.parse_args()
    rows = {row["workload"]: row for row in json.loads(args.cells.read_text())["rows"]}
    seeds = tuple(int(seed) for seed in args.seeds.split(","))
    workloads = [w for w in pc._workloads(seeds) if w in rows]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        jobs = [(w, args.variants, args.policy) for w in workloads]
        results = list(pool.map(_job, jobs))
    counts = [0, 0, 0]
    net = lost = 0
    for workload, hits in results:
        ref = rows[workload]["hit_blocks"]
        diffs = [h - max(a, b) for h, a, b in zip(hits, ref["lru"], ref["arc"], strict=True)]
        for d in diffs:
            counts[0 if d > 0 else 1 if d == 0 else 2] += 1
            net += d
            lost += min(d, 0)
        print(f"{workload:>16}: " + " ".join(f"{d:+7d}{'X' if d < 0 else ' '}" for d in diffs))
    print(
        f"{args.policy} {args.variants}: above {counts[0]}, equal {counts[1]}, "
        f"below {counts[2]}; net {net:+,}, lost {lost:,}; {time.perf_counter() - start:.0f} s"
    )
    if args.out:
        doc = {
            "benchmark": "density_variants",
            "machine": machine_info(),
            "commit": git_commit(),
            "load_average": os.getloadavg(),
            "configuration": {
                "variants": args.variants,
                "policy": args.policy,
                "seeds": seeds,
                "cells": str(args.cells),
                "shares": pc.SHARES,
            },
            "hit_blocks": dict(results),
            "summary": {
                "above": counts[0],
                "equal": counts[1],
                "below": counts[2],
                "net": net,
                "lost": lost,
            },
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
