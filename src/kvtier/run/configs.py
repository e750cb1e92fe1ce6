"""The offloading configurations ``kvtier run`` compares: each one is just a dict.

Runs in the ``kvtier run`` process; pure Python. A configuration is a name and the
``offload`` argument of ``LLM`` (``None``: no offloading). The tier sizes are derived
from the workload, so that the CPU tier (or the disk tier) can hold every conversation
while the GPU pool cannot::

    none       offload=None                     recompute whatever left the GPU
    cpu        {"cpu_bytes_to_use": 2 x KV, ...}
    cpu+disk   {"cpu_bytes_to_use": KV / 4, "disk_path": ..., "disk_bytes_to_use": 2 x KV}
               (a small CPU tier, so that late turns are served by the disk)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.config import DEFAULT_EVICTION_POLICY
from kvtier.errors import ConfigError

NAMES = ("none", "cpu", "cpu+disk")
"""Every configuration ``kvtier run`` knows, in the order it runs them."""

_KIB = 2**10


@dataclass(frozen=True, slots=True)
class Configuration:
    """One way to run the workload.

    Attributes:
        name: ``none``, ``cpu`` or ``cpu+disk``.
        offload: the ``LLM(offload=...)`` dict, or ``None`` for no offloading.
    """

    name: str
    offload: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class TierSizes:
    """Byte budgets of the offloaded tiers (``None``: derived from the workload).

    Attributes:
        cpu_bytes: the CPU tier of the ``cpu`` configuration.
        cpu_bytes_with_disk: the CPU tier of the ``cpu+disk`` configuration.
        disk_bytes: the disk tier of the ``cpu+disk`` configuration.
    """

    cpu_bytes: int | None = None
    cpu_bytes_with_disk: int | None = None
    disk_bytes: int | None = None


def parse_names(text: str) -> tuple[str, ...]:
    """``"none,cpu"`` -> ``("none", "cpu")``, in the canonical order, without repeats.

    Raises:
        ConfigError: an unknown name, or none at all (key ``--configs``).
    """
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in wanted if name not in NAMES]
    if unknown or not wanted:
        raise ConfigError(
            "--configs", f"got {text!r}; give a comma-separated subset of {','.join(NAMES)}"
        )
    return tuple(name for name in NAMES if name in wanted)


def _round_kib(n: float) -> int:
    return max(1, math.ceil(n / _KIB)) * _KIB


def build_configurations(
    names: Sequence[str],
    kv_bytes: int,
    block_size: int,
    disk_path: str,
    sizes: TierSizes | None = None,
    eviction_policy: str = DEFAULT_EVICTION_POLICY,
    store_policy: str = "eager",
) -> tuple[Configuration, ...]:
    """The configurations named, sized for a workload whose distinct KV is ``kv_bytes``.

    Args:
        names: which configurations (see ``NAMES``).
        kv_bytes: bytes of KV the workload computes once (every conversation's history).
        block_size: tokens per offloaded block (the engine's page size).
        disk_path: the disk tier's directory (``cpu+disk`` only).
        sizes: byte budgets given by the user; missing ones (or ``None``) are derived
            from ``kv_bytes``.
        eviction_policy: every tier's eviction policy (CPU and disk).
        store_policy: when blocks are stored (``eager``, ``on_evict``, ``reuse``).
    """
    sizes = sizes or TierSizes()
    common = {
        "block_size": block_size,
        "eviction_policy": eviction_policy,
        "store_policy": store_policy,
    }
    cpu_bytes = sizes.cpu_bytes or _round_kib(2 * kv_bytes)
    small_cpu = sizes.cpu_bytes_with_disk or _round_kib(kv_bytes / 4)
    disk_bytes = sizes.disk_bytes or _round_kib(2 * kv_bytes)
    out = []
    for name in names:
        if name == "none":
            out.append(Configuration(name, None))
        elif name == "cpu":
            out.append(Configuration(name, {"cpu_bytes_to_use": cpu_bytes, **common}))
        elif name == "cpu+disk":
            offload = {
                "cpu_bytes_to_use": small_cpu,
                **common,
                "disk_path": disk_path,
                "disk_bytes_to_use": disk_bytes,
                "disk_eviction_policy": eviction_policy,
            }
            out.append(Configuration(name, offload))
        else:
            raise ConfigError("--configs", f"unknown configuration {name!r}")
    return tuple(out)
