"""The engine with offloading's worker half in a child process.

Only ``TransferJob`` and ``TransferResult`` values cross between the engine and the
child (the KV pool's tensors are shared once, at start, as a multi-process engine's
workers own theirs). Greedy tokens must be identical to the in-process worker half
and to no offloading, and real hits must come back through the child.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kvtier.blocks import Medium
from kvtier.connector.worker_process import WorkerProcess
from kvtier.engine import LLM
from kvtier.engine.offload_connector import OffloadingConnector

from .workload import GPU_BLOCKS, PAGE, chats


def serve(model: Any, offload: dict[str, Any], worker_process: bool) -> tuple[list, dict]:
    outs: list[list[int]] = []
    totals = {"loaded": 0, "cpu": 0, "disk": 0, "failed": 0}
    with LLM(
        model=model,
        num_gpu_blocks=GPU_BLOCKS,
        block_size=PAGE,
        offload=offload,
        worker_process=worker_process,
    ) as llm:
        assert isinstance(llm.connector, OffloadingConnector)
        if worker_process:
            worker = llm.connector.worker
            assert isinstance(worker, WorkerProcess)
            assert worker._proc.pid not in (None, os.getpid()) and worker._proc.is_alive()
        for p in chats():
            outs += llm.generate([p], max_new_tokens=4)
            llm.connector.flush()  # what reaches each tier does not depend on timing
            st = llm.last_stats
            assert st is not None
            totals["loaded"] += st.offload.loaded_blocks
            totals["cpu"] += st.offload.hit_blocks.get(Medium.CPU, 0)
            totals["disk"] += st.offload.hit_blocks.get(Medium.DISK, 0)
            totals["failed"] += st.offload.failed_loads
    return outs, totals


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_worker_half_in_a_child_process_gives_identical_tokens(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path, tier: str
) -> None:
    offload: dict[str, Any] = {"cpu_bytes_to_use": "8MiB", "block_size": PAGE}
    if tier == "disk":
        offload = {
            "cpu_bytes_to_use": 6 * 4096,
            "block_size": PAGE,
            "disk_path": str(tmp_path / "in-process"),
            "disk_bytes_to_use": "16MiB",
        }
    local_outs, local = serve(tiny_model, offload, worker_process=False)
    if tier == "disk":
        offload = {**offload, "disk_path": str(tmp_path / "child")}
    child_outs, child = serve(tiny_model, offload, worker_process=True)
    assert local_outs == baseline
    assert child_outs == baseline
    assert child == local, "the same hits, loads and failures wherever the worker runs"
    assert child["loaded"] > 0 and child["failed"] == 0
    if tier == "disk":
        assert child["disk"] > 0
