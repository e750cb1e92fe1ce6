"""Canonical byte views: fragments hold exactly each block's bytes, for every layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.errors import ConfigError
from kvtier.worker import KVLayout, kv_cache_view
from kvtier.worker.kv_view import word_dtype

from .conftest import DTYPES, LAYERS, LAYOUTS, all_pages, make_kv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fragments_concatenate_to_pages(layout: KVLayout, dtype: torch.dtype) -> None:
    kv = make_kv(layout, dtype, num_blocks=6)
    view = kv_cache_view(kv, layout)
    assert view.num_blocks == 6
    assert all(f.dtype == torch.uint8 and f.shape[0] == 6 for f in view.fragments)
    expected_frags = 2 * LAYERS if layout is KVLayout.KV_FIRST else len(kv)
    assert len(view.fragments) == expected_frags
    pages = np.concatenate([f.numpy() for f in view.fragments], axis=1)
    np.testing.assert_array_equal(pages, all_pages(kv, layout))
    assert view.page_bytes == pages.shape[1] == sum(t.numel() * t.element_size() for t in kv) // 6


def test_views_share_memory() -> None:
    kv = make_kv(KVLayout.KV_FIRST, torch.float16, num_blocks=3)
    view = kv_cache_view(kv)
    view.fragments[1][2].fill_(7)  # V page of layer 0, block 2
    assert (kv[0][1, 2].view(torch.uint8) == 7).all()
    assert not (kv[0][0, 2].view(torch.uint8) == 7).all()


@pytest.mark.parametrize(
    ("tensors", "layout", "match"),
    [
        ([], KVLayout.KV_FIRST, "no KV cache tensors"),
        ([torch.zeros(3, 4, 4, 2, 8)], KVLayout.KV_FIRST, "needs 5 dims"),
        ([torch.zeros(4, 3, 4, 2, 8)], KVLayout.BLOCKS_FIRST, "needs 5 dims"),
        ([torch.zeros(2, 4, 4, 2, 8), torch.zeros(2, 5, 4, 2, 8)], "kv_first", "disagree"),
        ([torch.zeros(2, 4, 8, 2, 4).transpose(2, 4)], "kv_first", "not contiguous"),
        ([torch.zeros(5)], KVLayout.CROSS_LAYER, ">= 2 dims"),
    ],
)
def test_rejects_bad_tensors(tensors, layout, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        kv_cache_view(tensors, layout)
    assert info.value.key == "gpu_kv_caches"


def test_checks_block_size() -> None:
    with pytest.raises(ConfigError, match="block size 4"):
        kv_cache_view([torch.zeros(2, 3, 4, 2, 8)], KVLayout.KV_FIRST, block_size=16)


def test_word_dtype_widest_that_tiles() -> None:
    base = torch.zeros(4, 64, dtype=torch.uint8)
    assert word_dtype(base) == torch.complex128
    assert word_dtype(base[:, 8:40]) == torch.int64
    assert word_dtype(base[:, 2:6]) == torch.int16
    assert word_dtype(base[:, 1:4]) == torch.uint8
