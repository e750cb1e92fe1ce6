"""The paged KV pool: layout, sizes, and slot arithmetic."""

from __future__ import annotations

import pytest
import torch

from kvtier.blocks import BlockId
from kvtier.engine.kv_pool import KVPool, KVShape
from kvtier.errors import ConfigError

LAYOUT = KVShape(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32)


def test_layout_is_what_the_worker_side_accepts(tiny_model) -> None:
    layout = KVShape.of_model(tiny_model)
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim) == (2, 2, 16)
    pool = KVPool(layout, num_blocks=5, block_size=4, device=torch.device("cpu"))
    assert len(pool.kv_caches) == 2
    assert all(t.shape == (2, 5, 4, 2, 16) and t.is_contiguous() for t in pool.kv_caches)
    # K and V, all layers, 4 tokens of 2 heads x 16 float32.
    assert pool.bytes_per_block == 2 * 2 * 4 * 2 * 16 * 4


def test_slots_follow_the_block_table() -> None:
    pool = KVPool(LAYOUT, num_blocks=8, block_size=4, device=torch.device("cpu"))
    table = [BlockId(5), BlockId(2), BlockId(7)]
    assert pool.slots(table, 2, 10).tolist() == [22, 23, 8, 9, 10, 11, 28, 29]


def test_scatter_writes_the_pages_gather_reads() -> None:
    pool = KVPool(LAYOUT, num_blocks=8, block_size=4, device=torch.device("cpu"))
    table = [BlockId(6), BlockId(1)]
    slots = pool.slots(table, 0, 7)
    k = torch.randn(2, 7, 4)
    v = torch.randn(2, 7, 4)
    pool.scatter(1, slots, k, v)
    got_k, got_v = pool.gather(1, slots)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    # Token 5 lives in block table[1] = 1, row 1, as (heads, dim).
    assert torch.equal(pool.kv_caches[1][0, 1, 1], k[:, 5])
    assert torch.equal(pool.kv_caches[1][1, 6, 3], v[:, 3])
    assert pool.kv_caches[0].abs().sum() == 0  # other layers untouched


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "key"), [(0, 4, "num_gpu_blocks"), (4, 0, "block_size")]
)
def test_bad_sizes(num_blocks: int, block_size: int, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        KVPool(LAYOUT, num_blocks, block_size, torch.device("cpu"))
    assert e.value.key == key
