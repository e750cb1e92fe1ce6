"""kvtier under vLLM's real OpenAI server (``python -m vllm.entrypoints.openai.api_server``).

Runs in the vLLM 0.32 environment (vLLM's CPU build runs the server). The servers are
shared by the module's tests, in the order they are written: a server without the
connector and one with kvtier's spec are started together and given the same
prompts; a second kvtier server runs beside the first; the first is then killed
with its whole session (and its reaper), and a third start must remove its file and
leave the live neighbour's alone; the neighbour is stopped with SIGTERM, as systemd
and Kubernetes stop a server, and must leave nothing behind.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_support import require_vllm_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

BLOCK = 32  # tokens per vLLM block
GPU_BLOCKS = 16  # vLLM's own cache: 512 tokens, less than the four documents
PAGE_BYTES = 2 * 2 * BLOCK * 2 * 32 * 4  # layers x (K, V) x tokens x kv heads x dim x fp32
DOC_TOKENS = 300  # nine full blocks each
MAX_TOKENS = 8


def _docs() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(1, 500) for _ in range(DOC_TOKENS)] for _ in range(4)]


class Servers:
    """The module's servers and what they answered."""

    def __init__(self, root: Path, model: Path) -> None:
        from kvtier.bench.vllm_server import ServerConfig, VllmServer

        self.root = root
        self.shm = root / "shm"
        self.shm.mkdir()
        self.model = model
        self._config = ServerConfig
        self._server = VllmServer
        self.started: list[Any] = []

    def config(self, engine_id: str | None) -> Any:
        kv_transfer = None
        if engine_id is not None:
            kv_transfer = {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "engine_id": engine_id,
                "kv_connector_extra_config": {
                    "spec_name": "KvtierOffloadingSpec",
                    "spec_module_path": "kvtier.integrations.vllm",
                    "cpu_bytes_to_use": "8MiB",
                    "shm_dir": str(self.shm),
                },
            }
        return self._config(
            model=self.model,
            kv_transfer=kv_transfer,
            block_size=BLOCK,
            num_gpu_blocks=GPU_BLOCKS,
            page_bytes=PAGE_BYTES,
            max_model_len=384,
        )

    def start(self, name: str, engine_id: str | None, *, wait: bool = True) -> Any:
        server = self._server(self.config(engine_id), self.root / f"{name}.log", wait=wait)
        self.started.append(server)
        return server

    def region(self, engine_id: str) -> Path:
        return self.shm / f"kvtier-vllm-{engine_id}.slab"

    def stop_all(self) -> None:
        for server in self.started:
            server.kill()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    require_vllm_engine()
    from tests.integrations.vllm_engine import build_model

    root = tmp_path_factory.mktemp("servers")
    build_model(root / "model")
    s = Servers(root, root / "model")
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="module")
def served(servers: Servers) -> dict[str, Any]:
    """The four documents twice through a server without kvtier and one with it."""
    baseline = servers.start("baseline", None, wait=False)
    kvtier = servers.start("kvtier-a", "a", wait=False)
    baseline.wait_ready()
    kvtier.wait_ready()
    out: dict[str, Any] = {"kvtier": kvtier}
    for name, server in (("baseline", baseline), ("kvtier", kvtier)):
        out[f"{name}_tokens"] = [
            server.complete(doc, MAX_TOKENS).tokens for _ in range(2) for doc in _docs()
        ]
    baseline.stop()
    return out


def test_completions_through_kvtier_are_the_servers_without_it(served: dict[str, Any]) -> None:
    assert len(served["kvtier_tokens"]) == 8
    assert all(len(t) == MAX_TOKENS for t in served["kvtier_tokens"])
    assert served["kvtier_tokens"] == served["baseline_tokens"]


def test_the_second_pass_comes_back_from_kvtier_and_vllms_byte_counters_say_so(
    served: dict[str, Any],
) -> None:
    """vLLM's GPU cache (16 blocks) cannot keep the four documents (9 full blocks each):
    the second pass loads every full block but the last token's from kvtier's CPU tier.
    vLLM's own transfer counters count exactly those bytes, both ways."""
    server = served["kvtier"]
    hits = server.metric("vllm:kv_offload_kvtier_tier_hits_total", tier="cpu")
    held = server.metric("vllm:kv_offload_kvtier_blocks", tier="cpu")
    assert hits == 4 * (DOC_TOKENS // BLOCK)
    assert held == 4 * (DOC_TOKENS // BLOCK)  # every full block stored once, none evicted
    assert server.metric("vllm:kv_offload_load_bytes_total") == hits * PAGE_BYTES
    assert server.metric("vllm:kv_offload_store_bytes_total") == held * PAGE_BYTES
    assert server.metric("vllm:kv_offload_load_time_total") > 0
    assert server.metric("vllm:kv_offload_store_time_total") > 0


def _gone(path: Path, within_s: float = 30.0) -> bool:
    """Whether ``path`` is removed within ``within_s`` (its reaper runs once the last
    process holding it has exited, a moment after the server's own exit)."""
    deadline = time.monotonic() + within_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def _reaper_of(region: Path) -> int | None:
    """The pid of the reaper process waiting on ``region``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"reaper.py") for arg in cmdline) and str(region).encode() in cmdline:
            return int(pid)
    return None


def test_a_start_removes_a_killed_servers_region_and_never_a_live_neighbours(
    servers: Servers, served: dict[str, Any]
) -> None:
    killed = served["kvtier"]
    neighbour = servers.start("kvtier-b", "b")
    assert servers.region("a").exists() and servers.region("b").exists()
    reaper = _reaper_of(servers.region("a"))
    assert reaper is not None, "the region's creator started its reaper"
    os.kill(reaper, signal.SIGKILL)  # the whole host's processes killed: no reaper either
    killed.kill()
    assert servers.region("a").exists(), "nothing left to remove it"
    third = servers.start("kvtier-c", "c")
    assert not servers.region("a").exists(), "the next start removed it"
    assert servers.region("b").exists(), "the live neighbour's region is untouched"
    assert neighbour.complete(_docs()[0], MAX_TOKENS).tokens == served["baseline_tokens"][0]
    third.stop()
    assert _gone(servers.region("c"))


def test_a_sigtermed_server_leaves_no_shared_memory(servers: Servers) -> None:
    neighbour = servers.started[-2]  # kvtier-b, still serving
    assert neighbour.alive and servers.region("b").exists()
    assert neighbour.stop() is not None
    assert _gone(servers.region("b"))
    assert sorted(p.name for p in servers.shm.iterdir()) == []
