"""The CPU tier's shared-memory region (plain Python: runs without vLLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.integrations.vllm.region import (
    STORE_FAILED,
    HostRegion,
    RegionLayout,
    region_path,
)


def test_two_mappings_share_each_ranks_slab_and_status(tmp_path: Path) -> None:
    layout = RegionLayout(num_blocks=3, shard_bytes=8, world_size=2)
    path = region_path(str(tmp_path), "engine/0")
    assert path.name == "kvtier-vllm-engine_0.slab"
    worker = HostRegion.open(path, layout)  # a worker process opens first
    manager = HostRegion.open(path, layout)
    assert path.stat().st_size == 2 * 3 * 8 + 2 * 3
    worker.slab(1)[2] = np.arange(8, dtype=np.uint8)
    worker.status()[1, 2] = STORE_FAILED
    assert manager.slab(1)[2].tolist() == list(range(8))
    assert manager.slab(0).sum() == 0  # rank 0's slab is untouched
    assert manager.status()[:, 2].tolist() == [0, STORE_FAILED]
    manager.unlink()
    assert not path.exists()
    worker.slab(0)[0] = 7  # mappings outlive the name
    assert manager.slab(0)[0, 0] == 7
    manager.close()
    worker.close()


def test_a_region_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.slab"
    HostRegion.open(path, RegionLayout(2, 8, 1)).close()
    with pytest.raises(ConfigError) as err:
        HostRegion.open(path, RegionLayout(4, 8, 1))
    assert err.value.key == "shm_dir"


def test_bad_sizes_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        RegionLayout(0, 8, 1)
    assert err.value.key == "num_blocks"
