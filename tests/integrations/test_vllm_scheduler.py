"""vLLM 0.33's real Scheduler and OffloadingConnector over kvtier's spec, TP=2 on CPU tensors.

Runs in the vLLM 0.33 environment (``scripts/setup-vllm.sh``); skips elsewhere. See
``vllm_harness`` for the engine loop and its byte oracle.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_support import require_vllm_at_least

pytestmark = pytest.mark.slow

DOC_BLOCKS = 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm_at_least("0.33")
    from tests.integrations.vllm_engine import build_model

    path = tmp_path_factory.mktemp("model")
    build_model(path)
    return path


@pytest.fixture
def harness_factory(model_dir: Path) -> Iterator[Any]:
    from tests.integrations.vllm_harness import Harness

    built: list[Any] = []

    def make(extra: dict[str, Any], **kw: Any) -> Any:
        h = Harness.build(
            model_dir,
            {
                "spec_name": "KvtierOffloadingSpec",
                "spec_module_path": "kvtier.integrations.vllm",
                **extra,
            },
            engine_id=f"kvtier-sched-{os.getpid()}-{len(built)}",
            **kw,
        )
        built.append(h)
        return h

    yield make
    for h in built:
        h.shutdown()


def docs_workload(h: Any, num_requests: int, seed: int = 0) -> None:
    """Requests over 8 shared documents of 5 blocks, each with its own 20-token tail."""
    rng = random.Random(seed)
    docs = [[rng.randrange(1, 500) for _ in range(DOC_BLOCKS * 32)] for _ in range(8)]
    for i in range(num_requests):
        tail = [rng.randrange(1, 500) for _ in range(20)]
        h.add(f"r{i}", docs[rng.randrange(8)] + tail, max_tokens=12)


def test_hundreds_of_steps_serve_prefixes_from_kvtier_with_right_bytes(
    harness_factory: Any,
) -> None:
    h = harness_factory({"cpu_bytes_to_use": 32 * 2 * 16384}, num_gpu_blocks=24)
    docs_workload(h, 80)
    h.run()
    m = h.manager
    stats = m.cpu.stats()
    # Deterministic: every job is waited for within its step.
    assert (h.steps, m.counts["hits"], m.counts["misses"]) == (268, 150, 63)
    assert (stats.stored, stats.evictions, stats.loads) == (110, 78, 84)
    assert h.checked_rows == 17984  # rows checked against the oracle before any compute
    assert m.cpu.num_free + len(m.cpu) == 32  # capacity: 32 blocks of 2 ranks x 16 KiB


def test_a_job_completes_only_when_both_ranks_report(harness_factory: Any) -> None:
    h = harness_factory({"cpu_bytes_to_use": 32 * 2 * 16384}, num_gpu_blocks=24)
    docs_workload(h, 40)
    h.hold_rank = 1  # rank 1's results reach the scheduler one step late
    held_loads = 0
    while h.scheduler.has_requests():  # bounded: step() fails past h.max_steps
        h.step()
        loads = h.last_meta.load_jobs
        if not loads:
            continue
        slots = {int(b) for job in loads.values() for b in job.src_spec.block_ids}
        cpu = h.manager.cpu
        keys = [k for k in cpu.keys() if cpu.slot(k) in slots]  # noqa: SIM118
        # Rank 0 finished these loads; rank 1's report is held: still pinned.
        assert all(h.manager.cpu.pins(k) > 0 for k in keys)
        held_loads += 1
        h.step()  # rank 1's report arrives
        assert all(h.manager.cpu.pins(k) == 0 for k in keys if k in h.manager.cpu)
    assert held_loads > 0
    assert h.checked_rows > 0


def test_disk_tier_promotes_before_vllm_hears_a_hit(harness_factory: Any, tmp_path: Path) -> None:
    """A CPU tier of 8 blocks in front of a disk tier: prefixes come back from disk
    through HIT_PENDING (promotion off the scheduler thread), with right bytes."""
    h = harness_factory(
        {
            "cpu_bytes_to_use": 8 * 2 * 16384,
            "disk_path": str(tmp_path / "disk"),
            "disk_bytes_to_use": "16MiB",
        },
        num_gpu_blocks=24,
    )
    docs_workload(h, 40)
    h.run()
    m = h.manager
    tiering = m.tiered.stats()
    assert tiering.promotions > 0 and tiering.promotion_failures == 0
    assert m.counts["pending"] > 0  # vLLM was told HIT_PENDING while blocks came up
    assert tiering.hit_blocks is not None
    assert h.checked_rows > 0
    # Each rank wrote its own shard files, named by the rank and world size.
    from kvtier.media.disk_layout import LAYOUT

    assert len(list((tmp_path / "disk" / LAYOUT).iterdir())) == 2
