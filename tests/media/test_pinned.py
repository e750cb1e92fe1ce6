"""Host slab sizing: exactly num_blocks x page_bytes, and what a budget really takes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import CapacityError, ConfigError
from kvtier.media import HostSlab, host_sizing, pinning_available


def test_slab_is_exactly_blocks_times_page() -> None:
    page = 3 * 5 * 4096 + 384  # deliberately not a power of two
    with HostSlab(7, page, pin=False) as slab:
        assert slab.tensor.shape == (7, page) and slab.tensor.dtype == torch.uint8
        assert slab.nbytes == 7 * page == slab.tensor.untyped_storage().nbytes()
        assert slab.block(3).data_ptr() == slab.tensor.data_ptr() + 3 * page
        assert slab.pinned is False


def test_default_pins_only_with_cuda() -> None:
    slab = HostSlab(2, 64)
    assert slab.pinned is pinning_available()
    slab.close()
    slab.close()


@pytest.mark.skipif(pinning_available(), reason="checks the no-CUDA refusal")
def test_pin_without_cuda_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="without CUDA"):
        HostSlab(2, 64, pin=True)


@pytest.mark.cuda
@pytest.mark.skipif(not pinning_available(), reason="needs CUDA")
def test_pinned_slab_is_exact_and_page_locked() -> None:
    with HostSlab(3, 3 * 65536 + 16, pin=True) as slab:
        assert slab.pinned and slab.tensor.is_pinned()
        assert slab.nbytes == slab.tensor.untyped_storage().nbytes() == 3 * (3 * 65536 + 16)


@pytest.mark.parametrize(("blocks", "page"), [(0, 8), (2, 0)])
def test_slab_rejects_empty(blocks: int, page: int) -> None:
    with pytest.raises(ConfigError):
        HostSlab(blocks, page, pin=False)


def test_host_sizing_example() -> None:
    # 32 layers x (K + V) x 16 KiB pages, offloaded blocks of 4 GPU blocks: 4 MiB per block.
    sizing = host_sizing(10 * 2**30 + 12345, [16384] * 64, block_size_factor=4)
    assert sizing.bytes_per_block == 4 * 2**20
    assert sizing.num_blocks == 2560
    assert sizing.host_bytes == 10 * 2**30


@given(
    budget=st.integers(1, 2**40),
    pages=st.lists(st.integers(1, 2**22), min_size=1, max_size=8),
    factor=st.integers(1, 8),
)
def test_host_sizing_never_exceeds_budget(budget: int, pages: list[int], factor: int) -> None:
    per_block = sum(pages) * factor
    if budget < per_block:
        with pytest.raises(CapacityError, match="holds no offloaded block"):
            host_sizing(budget, pages, factor)
        return
    sizing = host_sizing(budget, pages, factor)
    assert sizing.host_bytes == sizing.num_blocks * per_block
    assert 0 <= budget - sizing.host_bytes < per_block


@pytest.mark.parametrize(
    ("args", "key"), [((0, 8), "cpu_bytes_to_use"), ((8, [0]), "gpu_kv_caches")]
)
def test_host_sizing_rejects(args, key) -> None:
    with pytest.raises(ConfigError) as info:
        host_sizing(*args)
    assert info.value.key == key


def test_slab_rows_are_page_aligned_for_direct_io() -> None:
    from kvtier.media.direct_io import ALIGNMENT, is_aligned

    slab = HostSlab(3, 2 * ALIGNMENT, pin=False)
    assert all(slab.block(i).data_ptr() % ALIGNMENT == 0 for i in range(3))
    assert is_aligned(slab.block(1).numpy())
    assert int(slab.tensor.sum()) == 0
