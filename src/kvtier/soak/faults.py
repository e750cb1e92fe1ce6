"""The faults of the soak, and the time windows in which each one is in effect.

Runs in the soak process. Redis faults and a full disk last a random 1-4 s (the
soak heals them when due); damaged block files are instantaneous, their effect
comes when a load reads them; an engine SIGKILL happens during the next request
(``runner``), and ``engine_kill_full_disk`` restarts the engine with its disk full.
Every fault opens a window, for the estimate of time lost.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.soak.disk import DiskArea
from kvtier.soak.redis_proc import RedisProcess

FAULT_KINDS = (
    "redis_kill",
    "redis_stop",
    "block_flip",
    "block_truncate",
    "block_delete",
    "disk_full",
    "engine_kill",
    "engine_kill_full_disk",
)
"""Every kind the soak injects; each is injected once, in a seeded order (the engine
SIGKILL last), before any kind is drawn at random (by ``WEIGHTS``)."""

WEIGHTS = {kind: 1.0 for kind in FAULT_KINDS} | {"engine_kill": 0.2, "engine_kill_full_disk": 0.1}
"""Relative odds of each kind after the first round: restarting an engine process
(import torch, build the model) takes seconds, so it comes a quarter as often."""

GRACE_S = 2.0
"""A window stays open this long after its fault was healed (reconnects, backoff)."""

EFFECT_S = 5.0
"""The window of an instantaneous fault (a damaged block is found when loaded)."""


@dataclass(slots=True)
class Window:
    """When a fault was in effect: ``start .. end`` (``end`` is ``None`` until healed)."""

    kind: str
    start: float
    heal_at: float
    end: float | None = None


@dataclass(slots=True)
class Injector:
    """Injects faults into the soak's Redis and disk area; heals them when due.

    Attributes:
        injected: faults injected, per kind.
        no_effect: of those, faults that found nothing to act on (no block file yet).
        damaged: block files the soak damaged (never counted as corrupt by the checks).
        windows: every fault's window.
    """

    redis: RedisProcess
    disk: DiskArea
    engines: tuple[str, ...]
    rng: random.Random
    injected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    no_effect: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    damaged: set[Path] = field(default_factory=set)
    windows: list[Window] = field(default_factory=list)
    _plan: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        kills = ["engine_kill_full_disk", "engine_kill"]
        others = [k for k in FAULT_KINDS if k not in kills]
        self.rng.shuffle(others)
        self._plan = [*kills, *others]  # popped from the end: the restarts come last

    @property
    def every_kind_injected(self) -> bool:
        return all(self.injected.values())

    def active(self, kind: str) -> bool:
        return any(w.kind == kind and w.end is None for w in self.windows)

    def next_kind(self) -> str:
        """The planned kinds first, then a random kind not already in effect."""
        if self._plan:
            return self._plan.pop()
        free = [k for k in FAULT_KINDS if not self.active(k)]
        if self.active("redis_kill") or self.active("redis_stop"):
            free = [k for k in free if not k.startswith("redis")]
        return self.rng.choices(free, weights=[WEIGHTS[k] for k in free])[0]

    def inject(self, kind: str, now: float) -> None:
        """Inject one fault (``engine_kill*`` only records it: the runner kills)."""
        self.injected[kind] += 1
        lasting = kind in ("redis_kill", "redis_stop", "disk_full")
        heal_at = now + self.rng.uniform(1.0, 4.0) if lasting else now + EFFECT_S
        window = Window(kind, now, heal_at, None if lasting else heal_at + GRACE_S)
        self.windows.append(window)
        if kind == "redis_kill":
            self.redis.kill()
        elif kind == "redis_stop":
            self.redis.pause()
        elif kind == "disk_full":
            self.disk.fill()
        elif kind.startswith("block_"):
            engine = self.rng.choice(self.engines)
            path = self.disk.damage(engine, kind.removeprefix("block_"), self.rng)
            if path is None:
                self.no_effect[kind] += 1
            else:
                self.damaged.add(path)

    def heal(self, now: float, everything: bool = False) -> None:
        """Heal the lasting faults that are due (all of them with ``everything``)."""
        for w in self.windows:
            if w.end is not None or (w.heal_at > now and not everything):
                continue
            if w.kind == "redis_kill":
                self.redis.start()
            elif w.kind == "redis_stop":
                self.redis.resume()
            elif w.kind == "disk_full":
                self.disk.unfill()
            w.end = time.monotonic() + GRACE_S
