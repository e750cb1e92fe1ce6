"""``kvtier.tiers``: every engine's tiers are sized, opened and indexed here."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier import tiers
from kvtier.blocks import BlockHash, Medium
from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.media.disk_layout import block_file_size
from kvtier.media.remote_options import RemoteOptions
from kvtier.scheduler.manager import BlockState

PAYLOAD = 4096


def disk_config(path: Path, budget: int) -> OffloadingConfig:
    return OffloadingConfig.from_dict(
        {"cpu_bytes_to_use": 1 << 20, "disk_path": str(path), "disk_bytes_to_use": budget}
    )


def test_the_disk_budget_is_shared_evenly_by_the_stores_of_one_engine(tmp_path: Path) -> None:
    one = block_file_size(PAYLOAD)
    cfg = disk_config(tmp_path, 10 * one + 1)
    assert tiers.disk_blocks(cfg, PAYLOAD) == 10
    assert tiers.disk_blocks(cfg, PAYLOAD, stores=4) == 2  # (10 files + 1) // 4 = 2.5 files
    with pytest.raises(ConfigError, match=r"disk_bytes_to_use.*per store \(11 ranks\)"):
        tiers.disk_blocks(cfg, PAYLOAD, stores=11)


def test_recovered_keys_keep_complete_blocks_coldest_first_and_delete_lone_shards(
    tmp_path: Path,
) -> None:
    cfg = disk_config(tmp_path, 8 * block_file_size(PAYLOAD) * 2)
    a, b = (tiers.open_disk(cfg, f"rank{r}".encode(), stores=2) for r in range(2))
    payload = bytes(PAYLOAD)
    for key in (b"k1", b"k2", b"k3"):  # oldest first
        a.write_blocks([key], [payload])
    for key in (b"k1", b"k3", b"k4"):
        b.write_blocks([key], [payload])
    a.close()
    b.close()
    a, b = (tiers.open_disk(cfg, f"rank{r}".encode(), stores=2) for r in range(2))
    try:
        assert tiers.recovered_keys([a, b], 8) == [BlockHash(b"k1"), BlockHash(b"k3")]
        assert sorted(a.keys()) == [b"k1", b"k3"]  # k2 had no shard on rank 1
        assert sorted(b.keys()) == [b"k1", b"k3"]  # k4 had none on rank 0
        assert tiers.recovered_keys([a, b], 1) == [BlockHash(b"k3")]  # the warmest fit
    finally:
        a.close()
        b.close()


def test_the_disk_tier_holds_what_was_recovered_as_ready(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path, 1 << 20)
    keys = [BlockHash(b"x"), BlockHash(b"y")]
    tier = tiers.disk_tier(cfg, 4, keys, block_size=16, enable_events=True)
    assert tier.medium is Medium.DISK and tier.num_blocks == 4
    assert [tier.state(k) for k in keys] == [BlockState.READY] * 2
    assert list(tier.take_events()) == []  # nothing moved


def test_the_remote_tier_gets_a_connection_per_io_thread_each_way_and_two_more() -> None:
    cfg = OffloadingConfig.from_dict(
        {"cpu_bytes_to_use": 1 << 20, "remote_url": "redis://127.0.0.1:1/0", "remote_io_threads": 3}
    )
    options = RemoteOptions.from_config(cfg)
    assert options.max_connections == 2 * 3 + 2
    assert options.url == "redis://127.0.0.1:1/0"
    index = tiers.remote_tier(cfg, block_size=16, enable_events=False)
    assert (index.medium, index.num_blocks, index.policy.name) == (
        Medium.REMOTE,
        1_000_000,
        "lru",
    )


def test_reuse_gated_stores_need_at_least_two_lookups() -> None:
    for policy, threshold, expected in (("reuse", 0, 2), ("reuse", 3, 3), ("eager", 0, 0)):
        cfg = OffloadingConfig.from_dict(
            {"cpu_bytes_to_use": 1 << 20, "store_policy": policy, "store_threshold": threshold}
        )
        cpu = tiers.cpu_tier(cfg, 8, block_size=16, enable_events=False)
        assert cpu.store_threshold == expected
