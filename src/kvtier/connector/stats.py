"""``OffloadStats``: what a connector did, in counts an engine reports.

Runs anywhere; pure Python. The scheduler half counts (``Counters``) and hands out
frozen snapshots; the engine adds them up across calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvtier.blocks import Medium


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

    def __add__(self, other: OffloadStats) -> OffloadStats:
        """Both counts added (per tier for ``hit_blocks``): totals over several calls."""
        hits = dict(self.hit_blocks)
        for medium, n in other.hit_blocks.items():
            hits[medium] = hits.get(medium, 0) + n
        counts = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name != "hit_blocks"
        }
        return OffloadStats(hit_blocks=hits, **counts)


class Counters:
    """Mutable counters behind ``OffloadStats``."""

    def __init__(self) -> None:
        self.hits: dict[Medium, int] = {}
        self.loaded_blocks = self.stored_blocks = self.bytes_loaded = self.bytes_stored = 0
        self.failed_loads = self.failed_stores = self.refused_stores = self.refused_loads = 0

    def hit(self, medium: Medium, n: int) -> None:
        if n:
            self.hits[medium] = self.hits.get(medium, 0) + n

    def freeze(self) -> OffloadStats:
        return OffloadStats(
            hit_blocks=dict(self.hits),
            loaded_blocks=self.loaded_blocks,
            stored_blocks=self.stored_blocks,
            bytes_loaded=self.bytes_loaded,
            bytes_stored=self.bytes_stored,
            failed_loads=self.failed_loads,
            failed_stores=self.failed_stores,
            refused_stores=self.refused_stores,
            refused_loads=self.refused_loads,
        )
