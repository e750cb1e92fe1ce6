"""Tier capacities as a user writes them, resolved to block counts for one trace.

Three forms:

* a block count: ``4096``;
* a share of the trace's distinct blocks: ``5%`` (``round(0.05 × distinct)``, as the
  reference figures in ``SOURCES.md`` are computed), or ``inf`` for all of them
  (nothing is ever evicted);
* bytes: ``8GiB``, ``500MB``, ``1.5TiB``, ``123456B`` (read by ``kvtier.sizes``, as
  every size in kvtier) -- needs the model's KV bytes per token; a block holds
  ``block_size`` tokens, and only whole blocks count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from kvtier.errors import ConfigError
from kvtier.sizes import parse_bytes

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class CapacityKind(str, Enum):
    """How a capacity was written."""

    BLOCKS = "blocks"
    FRACTION = "fraction"
    BYTES = "bytes"


@dataclass(frozen=True, slots=True)
class Capacity:
    """A capacity as written, before it meets a trace.

    Attributes:
        text: what the user wrote (used as the label in reports).
        kind: which of the three forms it is.
        value: blocks, a fraction in ``[0, 1]``, or bytes.
    """

    text: str
    kind: CapacityKind
    value: float

    def blocks(
        self, *, distinct_blocks: int, block_size: int, kv_bytes_per_token: int | None
    ) -> int:
        """Resolve to a number of blocks for a trace.

        Raises:
            ConfigError: bytes were given without ``kv_bytes_per_token``.
        """
        if self.kind is CapacityKind.BLOCKS:
            return int(self.value)
        if self.kind is CapacityKind.FRACTION:
            return round(self.value * distinct_blocks)
        if kv_bytes_per_token is None:
            raise ConfigError(
                "--kv-bytes-per-token",
                f"capacity {self.text!r} is in bytes; give the model's KV bytes per token "
                "(e.g. 2 × layers × kv_heads × head_dim × dtype bytes)",
            )
        return int(self.value // (kv_bytes_per_token * block_size))


def parse_capacity(text: str, key: str = "--capacity") -> Capacity:
    """Parse ``4096``, ``5%``, ``inf`` or ``8GiB``.

    Raises:
        ConfigError: anything else, or a share above 100 %.
    """
    stripped = text.strip()
    if stripped.isdigit():
        return Capacity(text=stripped, kind=CapacityKind.BLOCKS, value=int(stripped))
    if stripped.lower() in ("inf", "infinite", "100%"):
        return Capacity(text="inf", kind=CapacityKind.FRACTION, value=1.0)
    percent = _PERCENT.match(stripped)
    if percent:
        share = float(percent.group(1)) / 100
        if share > 1:
            raise ConfigError(key, f"{text!r} is more than all distinct blocks; use <= 100%")
        return Capacity(text=stripped, kind=CapacityKind.FRACTION, value=share)
    if any(c.isalpha() for c in stripped):
        try:
            return Capacity(text=stripped, kind=CapacityKind.BYTES, value=parse_bytes(key, text))
        except ConfigError:
            pass
    raise ConfigError(
        key, f"cannot read capacity {text!r}; write blocks (4096), a share (5%), or bytes (8GiB)"
    )


def parse_capacities(text: str, key: str = "--sweep") -> tuple[Capacity, ...]:
    """Parse a comma-separated list of capacities (``1%,5%,10%``).

    Raises:
        ConfigError: an item is unreadable, or the list is empty.
    """
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(key, "give at least one capacity, e.g. 1%,5%,10%")
    return tuple(parse_capacity(item, key) for item in items)
