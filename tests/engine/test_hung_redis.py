"""A hung Redis (``redis-server`` SIGSTOPped) never blocks ``lookup`` or the engine.

The server keeps its socket open and answers nothing, the worst case for a client:
every call waits for its timeout. ``lookup`` must return at once (its existence checks
run on a background thread), the engine must keep serving the same tokens, and once
the server resumes, what it holds is found again. No timing is asserted: a blocked
call would hang the test into its pytest timeout instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.blocks import BlockHash, Medium
from kvtier.engine import LLM
from kvtier.keys import ModelFingerprint
from kvtier.spec import KVGeometry, OffloadingSpec
from tests.redis_server import RedisServer

from .workload import GPU_BLOCKS, PAGE, chats

GEOMETRY = KVGeometry(
    gpu_block_size=4,
    page_bytes=512,
    fingerprint=ModelFingerprint(model_id="hung", dtype="float16", kv_layout="x", block_size=4),
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()  # resumes it first if paused


def config(url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    # A long client timeout: a lookup that waited on the network would hang the test.
    return {"cpu_bytes_to_use": "64KiB", "remote_url": url, "remote_timeout_s": timeout_s}


@pytest.mark.timeout(60)
def test_lookup_returns_while_redis_is_stopped(server: RedisServer) -> None:
    spec = OffloadingSpec(config(server.url), GEOMETRY)
    manager = spec.get_manager()
    keys = [BlockHash(bytes([i]) * 32) for i in range(4)]
    spec.remote_store().write_many(keys[:3], [np.zeros(2048, np.uint8)] * 3)  # another engine's
    server.pause()
    assert manager.lookup(keys) == 0  # returns: the check runs in the background
    assert manager.discovering(keys), "the check is still waiting on the stopped server"
    assert manager.lookup(keys) == 0 and manager.lookup_known(keys) == 0
    server.resume()
    manager.wait_discoveries()
    assert manager.lookup_known(keys) == 3, "found once the server answers"
    assert manager.lookup(keys) == 3
    manager.shutdown()
    spec.shutdown()


@pytest.mark.timeout(120)
def test_the_engine_serves_the_same_tokens_while_redis_is_stopped(
    tiny_model: Any, server: RedisServer, baseline: list[list[int]]
) -> None:
    offload = {**config(server.url, timeout_s=0.5), "block_size": PAGE, "cpu_bytes_to_use": "8MiB"}
    with LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=offload) as llm:
        outs = [llm.generate([p], max_new_tokens=4)[0] for p in chats()[:4]]
        server.pause()
        cpu_hits = 0
        for p in chats()[4:]:
            outs += llm.generate([p], max_new_tokens=4)
            assert llm.last_stats is not None
            cpu_hits += llm.last_stats.offload.hit_blocks.get(Medium.CPU, 0)
        server.resume()
    assert outs == baseline
    assert cpu_hits > 0, "the CPU tier kept serving while Redis hung"
