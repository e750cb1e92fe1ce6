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

from kvtier.integrations.vllm.metrics import (
    BLOCKS,
    LOOKUPS,
    PROMOTION_FAILURES,
    PROMOTIONS,
    TIER_HITS,
)

pytestmark = pytest.mark.slow

DOC_BLOCKS = 5


@pytest.fixture
def harness_factory(model_dir: Path) -> Iterator[Any]:
    from tests.integrations.vllm_harness import Harness

    built: list[Any] = []

    def make(extra: dict[str, Any], *, model: Path | None = None, **kw: Any) -> Any:
        h = Harness.build(
            model or model_dir,
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


def prometheus(h: Any) -> Any:
    """vLLM's own Prometheus side of the offloading connector (``OffloadPromMetrics``,
    built from the spec's metric definitions) fed every stats payload the scheduler
    sent; returns ``sample(name, **labels)``, the value there (0 when never set)."""
    from functools import partial

    import prometheus_client as prom
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadPromMetrics,
    )

    registry = prom.CollectorRegistry()
    types = {t: partial(t, registry=registry) for t in (prom.Gauge, prom.Counter, prom.Histogram)}
    metrics = OffloadPromMetrics(h.scheduler.vllm_config, types, ["engine"], {0: ["0"]})
    for payload in h.connector_stats:
        metrics.observe(payload, 0)

    def sample(name: str, **labels: str) -> float:
        suffix = "_total" if name != BLOCKS else ""
        return registry.get_sample_value(name + suffix, {"engine": "0", **labels}) or 0.0

    return sample


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
    # The figures are LRU's. The manager shows LRU each request whole at its first
    # lookup (vLLM's GPU-served blocks touched too), so blocks of a document vLLM's own
    # cache still serves stay warm in the CPU tier and come back when vLLM evicts them.
    h = harness_factory(
        {"cpu_bytes_to_use": 32 * 2 * 16384, "eviction_policy": "lru"}, num_gpu_blocks=24
    )
    docs_workload(h, 80)
    h.run()
    m = h.manager
    stats = m.cpu.stats()
    # Deterministic: every job is waited for within its step.
    hits, misses = (m.metrics.total(LOOKUPS, (r,)) for r in ("hit", "miss"))
    assert (h.steps, hits, misses) == (269, 302, 58)
    assert (stats.stored, stats.evictions, stats.loads) == (98, 66, 102)
    assert h.checked_rows == 19328  # rows checked against the oracle before any compute
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
    from tests.integrations.vllm_harness import PAGE

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
    assert m.metrics.total(LOOKUPS, ("pending",)) > 0  # HIT_PENDING while blocks came up
    assert h.checked_rows > 0
    # kvtier's counters reached vLLM's Prometheus metrics, exactly.
    sample = prometheus(h)
    assert sample(PROMOTIONS, tier="disk") == tiering.promotions
    assert sample(TIER_HITS, tier="disk") == tiering.promotions  # every one delivered
    for result in ("hit", "pending", "miss"):
        assert sample(LOOKUPS, result=result) == m.metrics.total(LOOKUPS, (result,)) > 0
    loaded = sample("vllm:kv_offload_load_bytes") / (PAGE * len(h.ranks))  # vLLM's own count
    assert sample(TIER_HITS, tier="cpu") == loaded > 0
    assert sample(BLOCKS, tier="cpu") == len(m.cpu) > 0
    assert sample(BLOCKS, tier="disk") == len(m.tiered.secondaries[0]) > 0
    # Each rank wrote its own shard files, named by the rank and world size.
    from kvtier.media.disk_layout import LAYOUT

    assert len(list((tmp_path / "disk" / LAYOUT).iterdir())) == 2


def test_a_request_larger_than_the_cpu_tier_loads_what_the_tier_holds(
    harness_factory: Any, tmp_path: Path
) -> None:
    """A conversation of 16 blocks on disk behind a CPU tier of 6: its first 6 blocks
    are promoted and loaded, the rest computed. Promoting further would evict the
    request's own blocks before vLLM loads them, round after round while it waits (a
    promotion storm, no block ever loaded); the bytes stay right."""
    from tests.integrations.vllm_harness import PAGE, conversation, write_turn_by_turn

    disk = {"disk_path": str(tmp_path / "disk"), "disk_bytes_to_use": "16MiB"}
    cpu = {"cpu_bytes_to_use": 6 * 2 * 16384}
    chat = conversation(16)
    writer = harness_factory({**cpu, **disk}, num_gpu_blocks=24)
    write_turn_by_turn(writer, chat)  # 2 new blocks a turn, which fit the CPU tier
    assert len(writer.manager.tiered.secondaries[0]) == 16  # the whole chat on disk
    writer.shutdown()
    h = harness_factory({**cpu, **disk}, num_gpu_blocks=24)
    h.add("again", [*chat, 8], max_tokens=2)
    h.run()
    tiering = h.manager.tiered.stats()
    assert (tiering.promotions, tiering.promotion_failures) == (6, 0)
    assert prometheus(h)("vllm:kv_offload_load_bytes") == 6 * PAGE * len(h.ranks)
    assert h.checked_rows == 6 * 32 * len(h.ranks)  # the loaded rows, byte for byte


def test_corrupt_disk_blocks_are_recomputed_and_counted(
    harness_factory: Any, tmp_path: Path
) -> None:
    """A second engine over a disk tier whose every block was tampered with: each
    promotion fails its checksum, vLLM recomputes (right bytes), and the failures reach
    vLLM's metrics as ``corrupt``."""
    extra = {
        "cpu_bytes_to_use": 8 * 2 * 16384,
        "disk_path": str(tmp_path / "disk"),
        "disk_bytes_to_use": "16MiB",
    }
    first = harness_factory(extra, num_gpu_blocks=24)
    docs_workload(first, 16)
    first.run()
    first.shutdown()
    from kvtier.media.disk_layout import HEADER_REGION, LAYOUT, listed_blocks

    slots = [
        (b.segment, b.offset)
        for fp_dir in (tmp_path / "disk" / LAYOUT).iterdir()
        for b in listed_blocks(fp_dir)
    ]
    assert slots
    for path, offset in slots:  # a payload byte of every block's slot
        with open(path, "r+b") as f:
            f.seek(offset + HEADER_REGION + 100)
            byte = f.read(1)[0]
            f.seek(offset + HEADER_REGION + 100)
            f.write(bytes([byte ^ 0xFF]))
    h = harness_factory(extra, num_gpu_blocks=24)
    docs_workload(h, 16)
    h.run()
    failures = h.manager.tiered.stats().promotion_failures
    # Every tampered block fails (later promotions, if any, read the recomputed blocks
    # written through again: timing decides how many).
    assert failures > 0
    assert h.checked_rows > 0  # what was served was recomputed, with right bytes
    sample = prometheus(h)
    assert sample(PROMOTION_FAILURES, tier="disk", reason="corrupt") == failures
    assert sample(PROMOTION_FAILURES, tier="disk", reason="unavailable") == 0


def test_tier_events_reach_vllms_publisher_with_their_medium(
    harness_factory: Any, tmp_path: Path
) -> None:
    """With vLLM's KV events on, blocks stored to and removed from the CPU tier and
    the disk tier reach vLLM's event publisher, each with its medium."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    h = harness_factory(
        {
            "cpu_bytes_to_use": 8 * 2 * 16384,
            "disk_path": str(tmp_path / "disk"),
            "disk_bytes_to_use": 24 * 2 * 16384 + 65536,  # a disk tier that evicts too
        },
        num_gpu_blocks=24,
        kv_events=True,
    )
    docs_workload(h, 40)
    h.run()
    seen: dict[tuple[str, Any, Any], int] = {}
    for e in h.events:
        if isinstance(e, BlockStored | BlockRemoved) and e.medium is not None:
            key = (type(e).__name__, e.medium, getattr(e, "ownership", None))
            seen[key] = seen.get(key, 0) + len(e.block_hashes)
    disk = m = h.manager
    disk = m.tiered.secondaries[0]
    assert seen.get(("BlockStored", "CPU", None), 0) >= len(m.cpu)
    assert seen.get(("BlockRemoved", "CPU", None), 0) > 0
    stored_disk = seen.get(("BlockStored", "STORAGE", "kvtier-disk"), 0)
    removed_disk = seen.get(("BlockRemoved", "STORAGE", "kvtier-disk"), 0)
    assert stored_disk > 0 and removed_disk > 0
    assert stored_disk - removed_disk == len(disk)  # the events account for every block


def test_other_weights_under_the_same_name_never_read_the_blocks(
    harness_factory: Any, tmp_path: Path
) -> None:
    """A checkpoint rewritten in place (a fine-tune saved over its base model: same
    path, same config, other weights) does not see the blocks its predecessor left on
    disk; the unchanged checkpoint does (the control), and so does the same checkpoint
    again under the user's same ``model_identity``, but not under another one."""
    from kvtier.media.disk_layout import LAYOUT
    from tests.integrations.vllm_engine import build_model

    model = tmp_path / "model"
    build_model(model)
    extra = {
        "cpu_bytes_to_use": 8 * 2 * 16384,
        "disk_path": str(tmp_path / "disk"),
        "disk_bytes_to_use": "16MiB",
    }

    def blocks_found(extra: dict[str, Any]) -> int:
        h = harness_factory(extra, model=model, num_gpu_blocks=24)
        found = len(h.manager.tiered.secondaries[0])  # recovered from disk at start
        docs_workload(h, 12)
        h.run()
        assert h.checked_rows > 0  # right bytes either way
        h.shutdown()
        return found

    assert blocks_found(extra) == 0  # an empty disk
    stored = blocks_found(extra)
    assert stored > 0  # the control: the same checkpoint finds what it stored
    assert blocks_found({**extra, "model_identity": "base-v1"}) == 0  # another identity
    assert blocks_found({**extra, "model_identity": "base-v1"}) > 0
    shard_dirs = len(list((tmp_path / "disk" / LAYOUT).iterdir()))
    weights = next(model.glob("*.safetensors"))
    raw = bytearray(weights.read_bytes())
    raw[-4096:] = bytes(4096)  # other weights, same size, same name, same config
    weights.write_bytes(bytes(raw))
    assert blocks_found(extra) == 0
    assert len(list((tmp_path / "disk" / LAYOUT).iterdir())) == shard_dirs + 2  # 2 ranks
