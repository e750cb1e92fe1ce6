"""Identifiers shared by both sides: block keys, block ids and media.

Runs anywhere (no torch). Distinct types for distinct ids keep a slot number from
being passed where a key is expected, and ``Medium`` replaces magic strings.
"""

from __future__ import annotations

import enum
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
"""The key of an offloaded block: opaque bytes (kvtier's own SHA-256 keys, see
``kvtier.keys``, or a key computed by an engine)."""

BlockId = NewType("BlockId", int)
"""A slot in one medium: ``0 .. num_blocks - 1`` of that medium."""


class Medium(str, enum.Enum):
    """Where bytes can live. Compares equal to its name (``Medium.CPU == "CPU"``)."""

    GPU = "GPU"
    CPU = "CPU"
    DISK = "DISK"
    REMOTE = "REMOTE"

    def __str__(self) -> str:
        return self.value
