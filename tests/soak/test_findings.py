"""What ``kvtier soak`` found, each kept by a test that tells its story."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kvtier.blocks import Medium
from kvtier.engine import LLM, build_model
from kvtier.soak.disk import DiskArea
from kvtier.soak.runner import tail_lines
from tests.engine.workload import chats
from tests.tiny import TINY


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_an_engine_restarted_on_a_full_disk_starts_and_serves(tmp_path: Path) -> None:
    # Found by the soak: an engine SIGKILLed while the disk was full did not come back.
    # DiskStore.open probed O_DIRECT by writing a file (ENOSPC: "not a writable
    # directory") and refused a capacity above the free space ("lower it"): a fault
    # of the moment was taken for bad configuration, and the engine could not serve
    # at all, though every block on the disk was still good.
    torch.set_num_threads(1)
    model = build_model(TINY, seed=0, device="cpu")
    area = DiskArea(tmp_path / "disk", 8 * 2**20)
    cfg = {
        "cpu_bytes_to_use": 8 * 2048,
        "block_size": 4,
        "disk_path": str(area.engine_dir("a")),
        "disk_bytes_to_use": "4MiB",
    }
    prompts = chats()[:4]
    try:
        with LLM(model=model, num_gpu_blocks=40, block_size=4) as plain:
            expect = [plain.generate([p], max_new_tokens=4)[0] for p in prompts]
        with LLM(model=model, num_gpu_blocks=40, block_size=4, offload=cfg) as first:
            assert [first.generate([p], max_new_tokens=4)[0] for p in prompts] == expect
        assert area.fill() > 0
        with LLM(model=model, num_gpu_blocks=40, block_size=4, offload=cfg) as again:
            outs, disk_hits = [], 0
            for p in prompts:
                outs += again.generate([p], max_new_tokens=4)
                assert again.last_stats is not None
                disk_hits += again.last_stats.offload.hit_blocks.get(Medium.DISK, 0)
        assert outs == expect
        assert disk_hits > 0, "the blocks on the full disk were not served"
    finally:
        area.close()


def test_a_crash_line_ends_with_whole_lines_of_the_traceback() -> None:
    """The soak's crash line was the last 500 characters of the child's traceback, cut
    mid-word ("lity/observer.py", ...); it is the last whole lines that fit."""
    trace = (
        "Traceback (most recent call last):\n"
        + '  File "/x/kvtier/observability/observer.py", line 225, in record_stats\n' * 12
        + "ValueError: Counters can only be incremented by non-negative amounts.\n"
    )
    line = tail_lines(trace)
    assert line.endswith("ValueError: Counters can only be incremented by non-negative amounts.")
    assert line.startswith('File "/x/kvtier/observability/observer.py"')
    assert len(line) <= 500 + 3 * line.count(" | ")
    assert tail_lines("x" * 900) == "x" * 900  # one long line is kept whole
