"""A hung Redis (``redis-server`` SIGSTOPped) never blocks ``lookup`` or the engine.

The server keeps its socket open and answers nothing, the worst case for a client:
every call waits for its timeout. ``lookup`` must return at once (its existence checks
run on a background thread), the engine must keep serving the same tokens, and once
the server resumes, what it holds is found again. A fresh engine built while the
server hangs must not wait for it on its first request either. No timing is asserted:
a blocked call would hang the test into its pytest timeout instead, and an admission
that waits for a discovery answer says so (it answers ``None``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.blocks import BlockHash, Medium
from kvtier.engine import LLM
from kvtier.keys import ModelFingerprint
from kvtier.offloading_spec import KVGeometry, OffloadingSpec
from kvtier.scheduler.discovery import Discovery
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
    assert manager.has_pending_work, "the check is still waiting on the stopped server"
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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backoff_s", [0.5, 0.001])
def test_a_fresh_engine_does_not_wait_on_its_first_request_for_a_redis_hung_from_its_start(
    tiny_model: Any, server: RedisServer, baseline: list[list[int]], backoff_s: float
) -> None:
    """The engine is built while the server hangs: opening the store finds it hung (one
    timeout, at start), and no admission waits for a discovery answer from it, the
    first included (it once waited ``stall_s``, about 0.1 s, for the first check).
    Waiting shows without a clock: an admission that waits answers ``None``. With a
    backoff of 1 ms the first request's check is the breaker's probe, and hangs."""
    offload = {**config(server.url, timeout_s=0.5), "block_size": PAGE, "cpu_bytes_to_use": "8MiB"}
    offload["remote_backoff_s"] = backoff_s
    server.pause()
    with LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=offload) as llm:
        half = llm.connector.scheduler
        answers: list[int | None] = []
        admit = half.num_external_hit_pages

        def recorded(*args: Any) -> int | None:
            answers.append(admit(*args))
            return answers[-1]

        half.num_external_hit_pages = recorded  # type: ignore[method-assign]
        outs = [llm.generate([p], max_new_tokens=4)[0] for p in chats()]
    server.resume()
    assert outs == baseline
    assert len(answers) == len(chats()) and None not in answers, answers


class Blocked:
    """A shared store whose checks wait for ``release``; ``outages`` as the store's."""

    def __init__(self, outages: int) -> None:
        self.outages = outages
        self.release = threading.Event()

    def exists_many(self, ks: Sequence[bytes]) -> list[bool]:
        self.release.wait(60)
        return [True] * len(ks)


@pytest.mark.timeout(60)
def test_a_store_failing_since_its_last_answer_is_not_waited_for_until_it_answers() -> None:
    """An outage since the last answered check (here: at open, before any) makes the
    checks not worth waiting for; the first answer makes them worth it again."""
    store = Blocked(outages=1)
    d = Discovery(store, stall_s=600.0)
    keys = [BlockHash(bytes([i]) * 32) for i in range(3)]
    try:
        d.ask(keys)
        assert d.failing and not d.asking(keys[0])
        store.release.set()
        d.wait()
        assert [f.keys for f in d.answers()] == [tuple(keys)]
        assert not d.failing
        store.release.clear()
        d.ask(keys[1:])
        assert d.asking(keys[1]), "a store that answered since its outage is waited for"
        store.outages = 2  # down again
        assert not d.asking(keys[1])
    finally:
        store.release.set()
        d.shutdown()
