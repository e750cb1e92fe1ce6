"""The engine with a remote tier on a real redis-server shared by engines.

A second engine, in another process, hits what the first computed and produces the
same tokens; a different model never hits; Redis killed mid-run leaves the engine
serving the same tokens, and hits come back once Redis is up again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtier.blocks import Medium
from kvtier.engine import LLM, ModelSize, build_model
from kvtier.engine.offload_connector import OffloadingConnector
from tests.byte_oracle import ByteRecorder, install_recorder
from tests.redis_server import RedisServer

from .workload import GPU_BLOCKS, PAGE, chats

CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from kvtier.engine import LLM, build_model
from tests.tiny import TINY
cfg = json.loads(sys.argv[1])
prompts = json.loads(sys.argv[2])
with LLM(model=build_model(TINY, seed=0, device="cpu"), num_gpu_blocks=40, block_size=4,
         offload=cfg) as llm:
    outs = [llm.generate([p], max_new_tokens=4)[0] for p in prompts]
print(json.dumps(outs))
"""


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", ["--maxmemory", "64mb"]).start()
    yield server
    server.stop()


def remote_cfg(url: str) -> dict[str, Any]:
    # A CPU tier of 24 blocks (one prompt; it stages every store): what comes back
    # mostly comes from Redis.
    return {
        "cpu_bytes_to_use": 24 * 2048,
        "block_size": PAGE,
        "remote_url": url,
        "remote_timeout_s": 0.5,
        "remote_backoff_s": 0.05,
    }


def remote_llm(model: Any, url: str) -> LLM:
    return LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=remote_cfg(url))


def generate_all(
    llm: LLM, prompts: list[list[int]], recorder: ByteRecorder | None = None
) -> tuple[list[list[int]], int, int]:
    """Serve turn by turn; write-through finishes between turns (``flush``), so what
    reaches Redis does not depend on thread timing. With ``recorder`` (the byte
    oracle), every page loaded must be the page stored."""
    outs, remote_hits, failed = [], 0, 0
    for p in prompts:
        outs += llm.generate([p], max_new_tokens=4)
        assert isinstance(llm.connector, OffloadingConnector)
        llm.connector.flush()
        assert llm.last_stats is not None
        remote_hits += llm.last_stats.offload.hit_blocks.get(Medium.REMOTE, 0)
        failed += llm.last_stats.offload.failed_loads
    if recorder is not None:
        assert recorder.mismatches == []
    return outs, remote_hits, failed


@pytest.mark.timeout(600)  # its child engine alone may take up to 300 s on a loaded machine
def test_a_second_engine_process_hits_what_the_first_computed(
    tiny_model: Any, redis_server: RedisServer, baseline: list[list[int]]
) -> None:
    import json

    prompts = chats()
    first = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            json.dumps(remote_cfg(redis_server.url)),
            json.dumps(prompts[:4]),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert json.loads(first.stdout) == baseline[:4]
    # This engine never computed them: its first turns come from Redis.
    with remote_llm(tiny_model, redis_server.url) as llm:
        outs, remote_hits, failed = generate_all(llm, prompts[:4])
    assert outs == baseline[:4]
    assert remote_hits > 0 and failed == 0


def test_a_different_model_never_hits(
    tiny_model: Any, tiny_size: ModelSize, redis_server: RedisServer
) -> None:
    prompts = chats()[:4]
    with remote_llm(tiny_model, redis_server.url) as llm:
        generate_all(llm, prompts)
    other = build_model(tiny_size, seed=1, device="cpu")  # same name and config, other weights
    with remote_llm(other, redis_server.url) as llm:
        _, remote_hits, _ = generate_all(llm, prompts)
    assert remote_hits == 0


def test_redis_killed_mid_run_then_back(
    tiny_model: Any, redis_server: RedisServer, baseline: list[list[int]]
) -> None:
    prompts = chats()
    outs: list[list[int]] = []
    with remote_llm(tiny_model, redis_server.url) as llm:
        recorder = install_recorder(llm)
        part, hits_before, _ = generate_all(llm, prompts[:8], recorder)
        outs += part
        redis_server.kill()
        part, _, _ = generate_all(llm, prompts[8:9], recorder)  # no store, no lookup answers
        outs += part
        redis_server.start()  # empty: what it held is gone
        assert isinstance(llm.connector, OffloadingConnector)
        breaker = llm.connector.spec.remote_store().breaker
        deadline = time.monotonic() + 30
        while breaker.retry_in() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the backoff grew while Redis was down; the engine's
            # next operation after it is the probe that brings the tier back
        part, hits_after, failed_after = generate_all(llm, prompts[9:] + prompts[9:], recorder)
        outs += part
    assert outs == baseline + baseline[9:]
    assert hits_before > 0
    assert hits_after > 0, "the remote tier did not come back after Redis restarted"
    assert failed_after == 0, "blocks the restarted server lost were still trusted"
