"""One size parser for all of kvtier: a string means the same bytes in every place."""

from __future__ import annotations

import re

import pytest

from kvtier import cli
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.sim.capacity import parse_capacity
from kvtier.sizes import format_bytes, parse_byte_list, parse_bytes


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("4096", 4096),
        ("512B", 512),
        ("16KB", 16_000),
        ("16kb", 16_000),
        ("16KiB", 16_384),
        ("1.5GiB", 3 << 29),
        ("512 MB", 512_000_000),
        ("2TiB", 2 << 40),
    ],
)
def test_forms(text: str, n: int) -> None:
    assert parse_bytes("k", text) == n


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("16K", "16KiB (x1024) or 16KB (x1000)"),
        ("12QB", "unknown unit in '12QB'"),
        ("0", "must be more than 0"),
        ("0.1B", "must be more than 0"),
        ("-1KiB", "expected a byte size"),
        ("lots", "expected a byte size"),
        ("", "expected a byte size"),
    ],
)
def test_refused(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=r"config key .k.: .*" + re.escape(words)):
        parse_bytes("k", text)


def test_ints_and_bools() -> None:
    assert parse_bytes("k", 7) == 7
    with pytest.raises(ConfigError):
        parse_bytes("k", True)


def test_lists() -> None:
    assert parse_byte_list("k", "256KiB, 1MiB") == [262_144, 1_048_576]
    with pytest.raises(ConfigError, match="at least one size"):
        parse_byte_list("k", " , ")


def test_format() -> None:
    assert format_bytes(102_641_664) == "97.9 MiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(100 << 40) == "100.0 TiB"
    assert format_bytes(3 << 50) == "3072.0 TiB"


def _option(argv: list[str], dest: str) -> object:
    return getattr(cli.build_parser(argv).parse_args(argv), dest)


def test_the_same_string_is_the_same_bytes_everywhere() -> None:
    """Issue 11: ``--sizes 16KB`` and ``--pages 16KB`` used to differ (16000 vs 16384)."""
    assert _option(["bench", "disk", "--sizes", "16KB"], "sizes") == [16_000]
    assert _option(["bench", "remote", "--sizes", "16KB"], "sizes") == [16_000]
    assert _option(["bench", "transfer", "--pages", "16KB"], "pages") == [16_000]
    assert _option(["run", "--cpu-bytes", "16KB"], "cpu_bytes") == 16_000
    assert _option(["simulate", "--kv-bytes-per-token", "16KB"], "kv_bytes_per_token") == 16_000
    assert OffloadingConfig.from_dict({"cpu_bytes_to_use": "16KB"}).cpu_bytes_to_use == 16_000
    assert parse_capacity("16KB").value == 16_000
