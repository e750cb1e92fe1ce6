"""The workload and helpers the engine-level observability tests share."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvtier.engine.llm import LLM
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.scheduler.manager import BlockState, TierManager
from kvtier.scheduler.tiering import TieredManager
from tests.engine.workload import GPU_BLOCKS, PAGE, chats

__all__ = ["GPU_BLOCKS", "PAGE", "chats", "disk_cfg", "ready_blocks", "scrape", "tiers"]

BLOCK_BYTES = 2048
"""Bytes of one 4-token block of the tiny model (2 layers, K and V, 2 heads x 16, fp32)."""


def disk_cfg(path: Path, cpu_blocks: int = 8, disk_bytes: str = "1MiB") -> dict[str, Any]:
    """A CPU tier too small for the chats (so blocks come back from disk), disk behind."""
    return {
        "cpu_bytes_to_use": cpu_blocks * BLOCK_BYTES,
        "block_size": PAGE,
        "disk_path": str(path),
        "disk_bytes_to_use": disk_bytes,
    }


def tiers(llm: LLM) -> tuple[TierManager, ...]:
    assert isinstance(llm.connector, OffloadingConnector)
    manager = llm.connector.manager
    if isinstance(manager, TieredManager):
        return (manager.primary, *manager.secondaries)
    return (manager,)


def ready_blocks(llm: LLM) -> dict[str, set[bytes]]:
    """The READY keys of each tier, by medium name."""
    out = {}
    for t in tiers(llm):
        held = t.keys()  # a TierManager is not iterable
        out[str(t.medium)] = {bytes(k) for k in held if t.state(k) is BlockState.READY}
    return out


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One real HTTP scrape, parsed: ``(sample name, labels) -> value``."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
