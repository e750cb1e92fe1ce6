"""``PageLock``: the CPU tier's memory locked in place for the GPU, and only there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.media.page_lock import PageLock


def test_without_cuda_nothing_is_locked_and_the_bytes_are_untouched() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the locking test below runs instead")
    tensor = torch.from_numpy(np.arange(4096, dtype=np.uint8))
    lock = PageLock(tensor)
    assert not lock.locked
    lock.release()
    assert tensor.numpy().tolist() == list(np.arange(4096, dtype=np.uint8))


@pytest.mark.cuda
def test_a_mapping_is_page_locked_in_place_and_unlocked_at_release() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    host = torch.from_numpy(np.zeros((64, 4096), dtype=np.uint8))
    assert not host.is_pinned()
    lock = PageLock(host, required=True)
    assert lock.locked and host.is_pinned()
    device = torch.arange(64 * 4096, device="cuda").to(torch.uint8).view(64, 4096)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        host.copy_(device, non_blocking=True)
    stream.synchronize()
    assert torch.equal(host, device.cpu())
    lock.release()
    assert not lock.locked and not host.is_pinned()
