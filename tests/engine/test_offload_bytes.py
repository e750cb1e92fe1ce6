"""End to end through the byte recorder: every page loaded is the page that was stored.

Same tokens as an engine without offloading is a weak oracle (the tiny model's greedy
tokens survive many wrong pages), so these tests also run every transfer through
``tests/byte_oracle`` and assert the exact counts, failures included. Write-through is
flushed between turns, so what reaches the disk does not depend on thread timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvtier.blocks import Medium
from kvtier.connector.worker_half import ConnectorWorker
from kvtier.engine import LLM
from kvtier.media.disk_layout import LAYOUT, listed_blocks
from tests.byte_oracle import ByteRecorder, install_recorder

from .workload import GPU_BLOCKS, PAGE, chats


@dataclass(frozen=True)
class Totals:
    """Over every turn served: blocks found per tier, loaded, stored, failed."""

    cpu_hits: int
    disk_hits: int
    loaded: int
    stored: int
    failed_loads: int
    failed_stores: int


def serve(
    llm: LLM, prompts: list[list[int]], before_turn: Any = None
) -> tuple[list[list[int]], Totals]:
    outs: list[list[int]] = []
    n = dict.fromkeys(Totals.__dataclass_fields__, 0)
    for i, prompt in enumerate(prompts):
        if before_turn is not None:
            before_turn(i)
        outs += llm.generate([prompt], max_new_tokens=4)
        llm.connector.flush()  # type: ignore[attr-defined]
        st = llm.last_stats
        assert st is not None
        n["cpu_hits"] += st.offload.hit_blocks.get(Medium.CPU, 0)
        n["disk_hits"] += st.offload.hit_blocks.get(Medium.DISK, 0)
        n["loaded"] += st.offload.loaded_blocks
        n["stored"] += st.offload.stored_blocks
        n["failed_loads"] += st.offload.failed_loads
        n["failed_stores"] += st.offload.failed_stores
    return outs, Totals(**n)


def disk_llm(model: Any, path: Path) -> LLM:
    # A CPU tier of 24 blocks (a prompt's new blocks fit, to stage them): what comes
    # back comes back from disk.
    offload = {
        "cpu_bytes_to_use": 24 * 2048,
        "block_size": PAGE,
        "disk_path": str(path),
        "disk_bytes_to_use": "16MiB",
    }
    return LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=offload)


def flip_payload_bytes(path: Path) -> int:
    """Flip one payload byte of every block the disk's index lists (past the 4 KiB header)."""
    flipped = 0
    for fp_dir in sorted((path / LAYOUT).iterdir()):
        for block in listed_blocks(fp_dir):
            with open(block.segment, "r+b") as f:
                f.seek(block.offset + 5000)
                byte = f.read(1)[0]
                f.seek(block.offset + 5000)
                f.write(bytes([byte ^ 0xFF]))
            flipped += 1
    return flipped


def assert_clean(recorder: ByteRecorder, loaded_pages: int) -> None:
    assert recorder.mismatches == [], "a load served bytes other than those stored"
    assert recorder.pages_checked == loaded_pages


def test_disk_tier_serves_the_stored_bytes(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    llm = disk_llm(tiny_model, tmp_path)
    recorder = install_recorder(llm)
    outs, totals = serve(llm, chats())
    llm.close()
    assert_clean(recorder, totals.loaded)
    assert totals == Totals(
        cpu_hits=0, disk_hits=51, loaded=51, stored=85, failed_loads=0, failed_stores=0
    )
    assert outs == baseline


def test_flipped_disk_bytes_fail_verification_and_are_recomputed(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    llm = disk_llm(tiny_model, tmp_path)
    recorder = install_recorder(llm)
    flipped = []

    def corrupt(turn: int) -> None:
        if turn % 3 == 2:
            flipped.append(flip_payload_bytes(tmp_path))

    outs, totals = serve(llm, chats(), corrupt)
    llm.close()
    assert_clean(recorder, totals.loaded)  # first: the oracle that does not trust the CRC
    # Every third turn flips a byte of every block on disk. Loads of flipped blocks fail
    # verification and are recomputed (and stored again); the recorder checked that
    # the 10 blocks that did load are the bytes stored.
    assert len(flipped) == 4 and min(flipped) > 0  # (how many blocks: thread timing)
    assert totals == Totals(
        cpu_hits=0, disk_hits=10, loaded=10, stored=126, failed_loads=41, failed_stores=0
    )
    assert outs == baseline


class GarbageThenFail:
    """A copier that scribbles over the destination GPU pages, then raises."""

    def __init__(self, kv_caches: list[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        self.calls = 0

    def copy(self, plan: Any, gpu_to_cpu: bool) -> None:
        self.calls += 1
        rows = torch.from_numpy(plan.gpu_rows)
        for t in self.kv_caches:
            t[:, rows] = torch.randn_like(t[:, rows]) * 100
        raise RuntimeError("injected load failure")


def test_failed_loads_are_counted_and_recomputed(
    tiny_model: Any, baseline: list[list[int]]
) -> None:
    llm = LLM(
        model=tiny_model,
        num_gpu_blocks=GPU_BLOCKS,
        block_size=PAGE,
        offload={"cpu_bytes_to_use": "8MiB", "block_size": PAGE},
    )
    recorder = install_recorder(llm)
    saboteur = GarbageThenFail(llm.pool.kv_caches)
    worker_half = llm.connector.worker.inner  # type: ignore[attr-defined]
    assert isinstance(worker_half, ConnectorWorker)
    handler = worker_half.worker._handlers[(Medium.CPU, Medium.GPU)]
    handler._copier = saboteur  # type: ignore[attr-defined]
    outs, totals = serve(llm, chats())
    llm.close()
    assert_clean(recorder, 0)  # no load succeeded, so none was checked
    assert saboteur.calls == 6  # one load job per returning turn with hits
    assert totals == Totals(
        cpu_hits=0, disk_hits=0, loaded=0, stored=85, failed_loads=51, failed_stores=0
    )
    assert outs == baseline


def test_a_restarted_engine_loads_what_the_first_stored(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    prompts = chats()
    first = disk_llm(tiny_model, tmp_path)
    before = install_recorder(first)
    serve(first, prompts[:4])
    first.close()
    second = disk_llm(tiny_model, tmp_path)
    recorder = install_recorder(second, carry=before)  # what the disk holds, by key
    outs, totals = serve(second, prompts[4:])
    second.close()
    assert_clean(recorder, totals.loaded)
    assert totals == Totals(
        cpu_hits=0, disk_hits=70, loaded=70, stored=54, failed_loads=0, failed_stores=0
    )
    assert outs == baseline[4:]
