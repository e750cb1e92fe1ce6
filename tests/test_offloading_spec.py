"""``OffloadingSpec``: one configuration builds both halves, in either order.

Sizes are derived once in the constructor; ``get_manager`` always returns a
``TieredManager`` (no secondary tier for CPU only); the disk index is read once; and
the worker half needs nothing from the manager (disk handlers keep no index).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.errors import ConfigError
from kvtier.keys import ModelFingerprint
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec
from kvtier.media.disk_layout import block_file_size
from kvtier.offloading_spec import KVGeometry, OffloadingSpec
from kvtier.scheduler import OffloadingManager
from kvtier.scheduler.tiering import TieredManager

LAYERS, PAGE, HEADS, HEAD_DIM = 2, 4, 2, 8
PAGE_BYTES = LAYERS * 2 * PAGE * HEADS * HEAD_DIM * 2  # float16: 512
FP = ModelFingerprint(model_id="spec-test", dtype="float16", kv_layout="kv_first", block_size=PAGE)
GEOMETRY = KVGeometry(gpu_block_size=PAGE, page_bytes=PAGE_BYTES, fingerprint=FP)


def kv_caches(num_blocks: int = 8) -> list[torch.Tensor]:
    shape = (2, num_blocks, PAGE, HEADS, HEAD_DIM)
    return [torch.zeros(shape, dtype=torch.float16) for _ in range(LAYERS)]


def disk_config(path: Path, blocks: int = 6) -> dict[str, object]:
    return {
        "cpu_bytes_to_use": 4 * 2 * PAGE_BYTES,
        "block_size": 2 * PAGE,
        "disk_path": str(path),
        "disk_bytes_to_use": blocks * block_file_size(2 * PAGE_BYTES),
    }


def test_sizes_are_derived_in_the_constructor() -> None:
    spec = OffloadingSpec({"cpu_bytes_to_use": 10 * 2 * PAGE_BYTES + 7, "block_size": 8}, GEOMETRY)
    assert spec.block_size_factor == 2
    assert spec.bytes_per_block == 2 * PAGE_BYTES
    assert (spec.num_cpu_blocks, spec.host_bytes) == (10, 10 * 2 * PAGE_BYTES)
    assert spec.num_disk_blocks == 0


def test_disk_blocks_fit_the_byte_budget(tmp_path: Path) -> None:
    spec = OffloadingSpec(disk_config(tmp_path, blocks=6), GEOMETRY)
    assert spec.num_disk_blocks == 6


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"cpu_bytes_to_use": "1MiB", "block_size": 6}, "block_size"),
        ({"cpu_bytes_to_use": "1MiB", "block_size": 8, "store_policy": "on_evict"}, "store_policy"),
        ({"cpu_bytes_to_use": PAGE_BYTES - 1, "block_size": PAGE}, "cpu_bytes_to_use"),
    ],
)
def test_bad_configuration_names_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        OffloadingSpec(raw, GEOMETRY)
    assert err.value.key == key


def test_cpu_only_is_a_tiering_with_no_secondary_tier() -> None:
    manager = OffloadingSpec({"cpu_bytes_to_use": "64KiB", "block_size": 8}, GEOMETRY).get_manager()
    assert type(manager) is TieredManager
    assert isinstance(manager, OffloadingManager) and isinstance(manager.primary, OffloadingManager)
    assert manager.secondaries == ()
    assert not manager.has_pending_work
    assert manager.primary.medium is Medium.CPU
    assert manager.primary.num_blocks == 64 * 1024 // (2 * PAGE_BYTES)


def test_a_remote_tier_is_a_shared_secondary_even_when_its_server_is_down() -> None:
    raw = {"cpu_bytes_to_use": "64KiB", "remote_url": "redis://127.0.0.1:1/0"}
    spec = OffloadingSpec(raw, GEOMETRY)
    manager = spec.get_manager()
    assert [t.medium for t in manager.secondaries] == [Medium.REMOTE]
    manager.shutdown()
    spec.shutdown()


@pytest.mark.parametrize("worker_first", [False, True])
def test_worker_and_manager_in_either_order_agree_on_the_disk(
    tmp_path: Path, worker_first: bool
) -> None:
    # A directory that already holds two blocks of this model and block size.
    first = OffloadingSpec(disk_config(tmp_path), GEOMETRY)
    old = [BlockHash(bytes([i]) * 32) for i in (1, 2)]
    disk = first.disk_store()
    for key in old:
        disk.write(key, bytes(2 * PAGE_BYTES))
    first.shutdown()

    spec = OffloadingSpec(disk_config(tmp_path), GEOMETRY)
    if worker_first:
        worker = spec.get_worker(kv_caches())
        manager = spec.get_manager()
    else:
        manager = spec.get_manager()
        worker = spec.get_worker(kv_caches())
    disk_tier = manager.secondaries[0]
    assert sorted(disk_tier.keys()) == sorted(old)
    assert spec.disk_index() is spec.disk_index(), "read once"
    # A write job that names an evicted key deletes it before writing: the worker
    # follows the index with nothing but the spec.
    new = BlockHash(b"\x09" * 32)
    job = (
        CPULoadStoreSpec((BlockId(0),)),
        DiskLoadStoreSpec((BlockId(0),), (new,), evicted_hashes=(old[0],)),
    )
    assert worker.transfer_async(1, job)
    worker.wait([1])
    (result,) = worker.get_finished()
    assert result.success, result.error
    assert sorted(spec.disk_store().keys()) == sorted([old[1], new])
    spec.shutdown()
