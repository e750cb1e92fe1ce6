"""Capacities as blocks, shares of distinct blocks, or bytes."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.sim.capacity import CapacityKind, parse_capacities, parse_capacity
from kvtier.sizes import parse_bytes


def _blocks(text: str, kv: int | None = None) -> int:
    return parse_capacity(text).blocks(distinct_blocks=43924, block_size=512, kv_bytes_per_token=kv)


def test_forms() -> None:
    assert _blocks("4096") == 4096
    assert _blocks("5%") == 2196  # round(0.05 * 43924), as SOURCES.md
    assert _blocks("0.5%") == 220
    assert _blocks("inf") == 43924
    assert _blocks("8GiB", kv=160 * 1024) == 102  # 8 GiB / (160 KiB * 512 tokens)
    assert _blocks("1GB", kv=1000) == 1953
    assert parse_capacity("5%").kind is CapacityKind.FRACTION


@pytest.mark.parametrize("text", ["", "abc", "5 blocks", "-3", "150%", "1.5"])
def test_bad_capacity(text: str) -> None:
    with pytest.raises(ConfigError, match="--capacity"):
        parse_capacity(text)


def test_bytes_need_kv_bytes_per_token() -> None:
    with pytest.raises(ConfigError, match="--kv-bytes-per-token"):
        _blocks("8GiB")


def test_lists_and_sizes() -> None:
    assert [c.text for c in parse_capacities("1%, 5%,100")] == ["1%", "5%", "100"]
    with pytest.raises(ConfigError, match="--sweep"):
        parse_capacities(" , ")
    assert parse_bytes("k", "160KiB") == 163840
    assert parse_bytes("k", "163840") == 163840
    with pytest.raises(ConfigError):
        parse_bytes("k", "0")
