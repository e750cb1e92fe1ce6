"""Offloading configuration: validated once, frozen, errors name the key."""

from __future__ import annotations

import dataclasses

import pytest

from kvtier.config import OffloadingConfig, parse_bytes
from kvtier.errors import ConfigError


def test_defaults_and_sizes() -> None:
    cfg = OffloadingConfig.from_dict({"cpu_bytes_to_use": "1GiB"})
    assert cfg.cpu_bytes_to_use == 2**30
    assert (cfg.block_size, cfg.eviction_policy, cfg.hash_algorithm) == (16, "lru", "sha256")
    assert parse_bytes("x", "512 MB") == 512 * 10**6
    assert parse_bytes("x", "1.5KiB") == 1536
    assert parse_bytes("x", 4096) == 4096


def test_every_key_left_out_takes_the_dataclass_default() -> None:
    """``from_dict`` and the dataclass agree on every default (one place writes each):
    the tiers' keys too, once their tier is configured."""
    given = {
        "cpu_bytes_to_use": 1 << 20,
        "disk_path": "/tmp/kvtier-config-test",
        "disk_bytes_to_use": 1 << 20,
        "remote_url": "redis://127.0.0.1:6379",
    }
    cfg = OffloadingConfig.from_dict(given)
    for f in dataclasses.fields(OffloadingConfig):
        if f.name in given or f.name == "disk_direct_io":  # "auto" is stored as None
            continue
        assert getattr(cfg, f.name) == f.default, f.name
    assert cfg.disk_direct_io is None


def test_config_is_frozen() -> None:
    cfg = OffloadingConfig.from_dict({"cpu_bytes_to_use": 1 << 20})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_size = 32  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "key", "hint"),
    [
        ({}, "cpu_bytes_to_use", "required"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use", "8GiB"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use", "more than 0"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use", "byte size"),
        ({"cpu_bytes_to_use": 1, "block_size": 0}, "block_size", "positive integer"),
        ({"cpu_bytes_to_use": 1, "block_size": "16"}, "block_size", "positive integer"),
        (
            {"cpu_bytes_to_use": 1, "eviction_policy": "mru"},
            "eviction_policy",
            "arc, density, leader, lru",
        ),
        ({"cpu_bytes_to_use": 1, "store_threshold": -2}, "store_threshold", ">= 0"),
        ({"cpu_bytes_to_use": 1, "enable_events": "yes"}, "enable_events", "true or false"),
        ({"cpu_bytes_to_use": 1, "hash_algorithm": "md5"}, "hash_algorithm", "sha256"),
        ({"cpu_bytes_to_use": 1, "cpu_byte_to_use": 1}, "cpu_byte_to_use", "did you mean"),
        ({"cpu_bytes_to_use": 1, "colour": 1}, "colour", "known keys"),
        ({"cpu_bytes_to_use": 1, "store_policy": "lazy"}, "store_policy", "eager, on_evict"),
    ],
)
def test_bad_values_name_the_key_and_what_to_change(
    raw: dict[str, object], key: str, hint: str
) -> None:
    with pytest.raises(ConfigError, match=hint) as err:
        OffloadingConfig.from_dict(raw)
    assert err.value.key == key
    assert repr(key) in str(err.value)


def test_num_cpu_blocks() -> None:
    cfg = OffloadingConfig.from_dict({"cpu_bytes_to_use": 10_000})
    assert cfg.num_cpu_blocks(3_000) == 3
    with pytest.raises(ConfigError, match="cpu_bytes_to_use"):
        cfg.num_cpu_blocks(20_000)
