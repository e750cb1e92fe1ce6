"""Byte sizes as people write them, and as kvtier prints them: one parser for everything.

Runs anywhere; pure Python. Every size kvtier reads -- configuration keys
(``cpu_bytes_to_use``), command options (``--sizes``, ``--pages``, ``--disk-bytes``,
``--kv-bytes-per-token``) -- goes through ``parse_bytes``, so a string means the same
number of bytes everywhere:

=========================  ==============================================
``4096``, ``"4096"``       bytes
``"512B"``                 bytes
``"16KB"`` ``"1.5GB"``     decimal: 10^3, 10^6, 10^9, 10^12 (as disks are sold)
``"16KiB"`` ``"8GiB"``     binary: 2^10, 2^20, 2^30, 2^40 (as memory is counted)
=========================  ==============================================

Units are case-insensitive and may follow a space (``"512 MB"``). A bare ``K``, ``M``,
``G`` or ``T`` is refused: tools disagree on whether it means 1000 or 1024, so the
message asks for ``KiB`` or ``KB``. ``format_bytes`` prints binary units (``97.9 MiB``).
"""

from __future__ import annotations

import re

from kvtier.errors import ConfigError

UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
"""Every unit ``parse_bytes`` accepts (lower case) and its multiplier."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_EXAMPLE = "write bytes (4096) or a number with a unit: 16KiB, 8GiB (binary), 512MB (decimal)"


def parse_bytes(key: str, value: object) -> int:
    """A positive byte count from an int or a string such as ``"8GiB"`` or ``"512 MB"``.

    Args:
        key: the configuration key or option the value came from (named in errors).
        value: an ``int``, or a string in one of the forms of the module docstring.

    Raises:
        ConfigError: naming ``key``, when the value is not a positive whole size.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a byte size, got {value!r}; {_EXAMPLE}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = m[2].lower()
        if unit not in UNITS:
            hint = (
                f"{m[1]}{unit.upper()}iB (x1024) or {m[1]}{unit.upper()}B (x1000)"
                if unit in ("k", "m", "g", "t")
                else _EXAMPLE
            )
            raise ConfigError(key, f"unknown unit in {value!r}; {hint}")
        n = int(float(m[1]) * UNITS[unit])
    else:
        raise ConfigError(key, f"expected a byte size, got {value!r}; {_EXAMPLE}")
    if n <= 0:
        raise ConfigError(key, f"must be more than 0 bytes, got {value!r}")
    return n


def parse_byte_list(key: str, text: str) -> list[int]:
    """A comma-separated list of sizes (``"256KiB,1MiB"``), each checked by ``parse_bytes``.

    Raises:
        ConfigError: an item is not a size, or the list is empty.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(key, f"give at least one size, e.g. 256KiB,1MiB; got {text!r}")
    return [parse_bytes(key, item) for item in items]


def format_bytes(n: int) -> str:
    """``102641664`` -> ``"97.9 MiB"``; below 1 KiB, ``"512 B"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
