"""Issue 17 item 3: a tier that cannot be reached or written is logged once and counted.

Real failures only: a Redis URL whose port nothing listens on, a disk tier on a small
tmpfs that something else fills, and one remounted read-only under the engine. The
engine keeps serving; every failed block shows up, by tier and reason, in
``last_stats``, in the metrics and in the manager's own count, and one warning names
the tier and where it is.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedModel

from kvtier.blocks import Medium
from kvtier.engine import LLM, OffloadStats
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.observability.failures import FailureKey
from kvtier.scheduler.tiering import TieredManager
from tests.redis_server import RedisServer, free_port, require_redis

from .engine_run import BLOCK_BYTES, GPU_BLOCKS, PAGE, chats, disk_cfg

LOGGER = "kvtier.observability.failures"


def _serve(llm: LLM, prompts: list[list[int]]) -> tuple[OffloadStats, list[list[int]]]:
    """Serve turn by turn, letting write-through finish between turns; a last 1-token
    call (which stores nothing) collects the failures of the last turn's writes."""
    assert isinstance(llm.connector, OffloadingConnector)
    totals, outputs = OffloadStats(), []
    for prompt in [*prompts, [1]]:
        outputs += llm.generate([prompt], max_new_tokens=4 if len(prompt) > 1 else 1)
        llm.connector.flush()
        assert llm.last_stats is not None
        totals = totals + llm.last_stats.offload
    return totals, outputs[: len(prompts)]


def _write_failures(llm: LLM) -> int:
    assert isinstance(llm.connector, OffloadingConnector)
    manager = llm.connector.manager
    assert isinstance(manager, TieredManager)
    return manager.stats().write_failures


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _metric(llm: LLM, tier: str, op: str, reason: str) -> float | None:
    assert llm.metrics is not None
    return llm.metrics.registry.get_sample_value(
        "kvtier_failed_blocks_total", {"tier": tier, "op": op, "reason": reason}
    )


def test_an_unreachable_redis_is_logged_once_and_every_write_counted(
    tiny_model: PreTrainedModel, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens there: connections are refused
    url = f"redis://127.0.0.1:{port}/0"
    cfg: dict[str, Any] = {
        "cpu_bytes_to_use": 24 * BLOCK_BYTES,
        "block_size": PAGE,
        "remote_url": url,
        "remote_timeout_s": 0.2,
        "remote_backoff_s": 0.05,
    }
    prompts = chats()
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg) as llm,
    ):
        totals, outputs = _serve(llm, prompts)
        failed = _write_failures(llm)
        assert totals.failures == {FailureKey(Medium.REMOTE, "store", "unreachable"): failed}
        assert _metric(llm, "REMOTE", "store", "unreachable") == failed
        assert failed == totals.stored_blocks  # every block stored in CPU failed to go on
        assert llm.metrics is not None
        registry = llm.metrics.registry
        outages = registry.get_sample_value("kvtier_tier_outages_total", {"tier": "REMOTE"})
        assert outages is not None and outages >= 1
        states = {
            state: registry.get_sample_value(
                "kvtier_tier_breaker_state", {"tier": "REMOTE", "state": state}
            )
            for state in ("healthy", "unhealthy", "probing")
        }
        assert states["healthy"] == 0 and states["unhealthy"] + states["probing"] == 1
    (line,) = _warnings(caplog)
    assert line.startswith(f"REMOTE tier at {url}: unreachable: ")
    assert len(outputs) == len(prompts) and all(len(o) == 4 for o in outputs)


def test_a_reachable_redis_counts_its_writes_and_reads_healthy(
    tiny_model: PreTrainedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis()
    server = RedisServer(tmp_path / "redis", ["--maxmemory", "64mb"]).start()
    cfg = {"cpu_bytes_to_use": 24 * BLOCK_BYTES, "block_size": PAGE, "remote_url": server.url}
    try:
        with (
            caplog.at_level(logging.WARNING, logger=LOGGER),
            LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg) as llm,
        ):
            totals, _ = _serve(llm, chats())
            assert isinstance(llm.connector, OffloadingConnector)
            manager = llm.connector.manager
            assert isinstance(manager, TieredManager)
            assert llm.metrics is not None
            registry = llm.metrics.registry
            assert totals.failures == {} and manager.stats().write_failures == 0
            written = registry.get_sample_value("kvtier_written_blocks_total", {"tier": "REMOTE"})
            assert written == manager.stats().writes == totals.stored_blocks
            healthy = {"tier": "REMOTE", "state": "healthy"}
            assert registry.get_sample_value("kvtier_tier_breaker_state", healthy) == 1
        assert _warnings(caplog) == []
    finally:
        server.stop()


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield path
    finally:
        if (path / "kv").is_mount():
            subprocess.run(["umount", "-l", str(path / "kv")], check=True)
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(disk: Path) -> None:
    """Take every free byte of the file system (as another program would)."""
    with open(disk.parent / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def _read_only(disk: Path) -> None:
    """Make the tier's directory read-only under the engine (a read-only bind mount
    over it: the store's open lock file stays, every new file is refused)."""
    subprocess.run(["mount", "--bind", str(disk), str(disk)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(disk)], check=True)


@pytest.mark.parametrize(
    ("break_it", "reason"), [(_fill, "full"), (_read_only, "unwritable")], ids=["full", "ro"]
)
def test_a_disk_that_cannot_be_written_is_logged_once_and_every_write_counted(
    tiny_model: PreTrainedModel,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    break_it: Any,
    reason: str,
) -> None:
    prompts = chats()
    with _tmpfs(tmp_path / "mnt", "2m") as mnt:
        disk = mnt / "kv"
        cfg = disk_cfg(disk, cpu_blocks=8, disk_bytes="512KiB")
        with (
            caplog.at_level(logging.WARNING, logger=LOGGER),
            LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg) as llm,
        ):
            break_it(disk)
            totals, outputs = _serve(llm, prompts)
            failed = _write_failures(llm)
            assert failed > 0
            assert totals.failures == {FailureKey(Medium.DISK, "store", reason): failed}
            assert _metric(llm, "DISK", "store", reason) == failed
            assert totals.hit_blocks.get(Medium.DISK, 0) == 0  # nothing ever got there
        (line,) = _warnings(caplog)
        assert line.startswith(f"DISK tier at {disk}: {reason}: store of ")
        assert len(outputs) == len(prompts)
