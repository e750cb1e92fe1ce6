"""Issue 13: blocks are only ever shared by engines holding the same weights.

The bug: a model with the same architecture, config and name as another but other
weights (a new revision written into the same checkpoint directory, another random
init) got the same block keys, so a second engine over the same disk directory or
Redis was served the first model's KV, with no error. Keys now commit to a digest of
the weights (``docs/keys.md``). Same weights loaded again, in another process, still
hit; other weights never do, on any tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedModel

from kvtier.blocks import Medium
from kvtier.engine import LLM, build_model
from kvtier.engine.kv_pool import KVShape
from kvtier.engine.models import model_fingerprint
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.keys import BlockHasher
from tests.redis_server import RedisServer
from tests.tiny import TINY

from .workload import GPU_BLOCKS, PAGE, chats

PAGE_BYTES = 2048  # TINY: 2 (K, V) x 2 layers x 2 KV heads x 16 dims x 4 tokens x 4 bytes

CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from kvtier.engine import LLM, build_model
from tests.tiny import TINY
model, cfg, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = build_model(TINY, seed=model, device="cpu") if isinstance(model, int) else model
with LLM(model=model, num_gpu_blocks=40, block_size=4, offload=cfg, device="cpu") as llm:
    outs = [llm.generate([p], max_new_tokens=4)[0] for p in prompts]
print(json.dumps(outs))
"""

PROMPTS = chats()[:4]


def in_child(model: int | str, cfg: dict[str, Any]) -> list[list[int]]:
    """Serve PROMPTS in a fresh process (the model: a seed or a checkpoint path)."""
    args = [json.dumps(x) for x in (model, cfg, PROMPTS)]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return list(json.loads(out.stdout))


@dataclass
class Served:
    """PROMPTS served in this process.

    Attributes:
        outs: the generated tokens.
        hits: blocks found offloaded, per tier.
        gpu_hits: blocks served by the GPU prefix cache.
        covered: prompts none of whose loadable pages (every full page but the one
            holding the last token, which is always computed) was recomputed.
    """

    outs: list[list[int]] = field(default_factory=list)
    hits: dict[Medium, int] = field(default_factory=dict)
    gpu_hits: int = 0
    covered: int = 0


def serve(model: Any, cfg: dict[str, Any] | None) -> Served:
    served = Served()
    with LLM(
        model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg, device="cpu"
    ) as llm:
        for p in PROMPTS:
            served.outs += llm.generate([p], max_new_tokens=4)
            if isinstance(llm.connector, OffloadingConnector):
                llm.connector.flush()
            st = llm.last_stats
            assert st is not None
            for medium, n in st.offload.hit_blocks.items():
                served.hits[medium] = served.hits.get(medium, 0) + n
            req = st.requests[0]
            served.gpu_hits += req.gpu_hit_blocks
            loadable = (len(p) - 1) // PAGE
            served.covered += req.gpu_hit_blocks + req.loaded_blocks == loadable
    return served


@pytest.fixture(scope="module")
def other_model() -> PreTrainedModel:
    """Same name, architecture and config as ``tiny_model``; other weights."""
    return build_model(TINY, seed=1, device="cpu")


def test_cpu_tier_holds_nothing_for_other_weights(
    tiny_model: PreTrainedModel, other_model: PreTrainedModel
) -> None:
    # A CPU tier lives in one engine; what it must not do is answer another model's keys.
    cfg = {"cpu_bytes_to_use": 256 * PAGE_BYTES, "block_size": PAGE}
    with LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg) as llm:
        for p in PROMPTS:
            llm.generate([p], max_new_tokens=4)
        assert isinstance(llm.connector, OffloadingConnector)
        manager = llm.connector.scheduler.manager

        def keys(model: PreTrainedModel, prompt: list[int]) -> list[bytes]:
            fp = model_fingerprint(model, KVShape.of_model(model), PAGE)
            return list(BlockHasher(fp).hash_prompt(prompt))

        ours = [manager.lookup(keys(tiny_model, p)) for p in PROMPTS]
        theirs = [manager.lookup(keys(other_model, p)) for p in PROMPTS]
    assert ours == [len(p) // PAGE for p in PROMPTS], "every full block was stored"
    assert theirs == [0, 0, 0, 0]


def test_a_new_revision_in_the_same_checkpoint_directory_never_hits_the_disk(
    tiny_model: PreTrainedModel, other_model: PreTrainedModel, tmp_path: Path
) -> None:
    checkpoint, cache = tmp_path / "model", tmp_path / "cache"
    cfg = {
        "cpu_bytes_to_use": 256 * PAGE_BYTES,
        "block_size": PAGE,
        "disk_path": str(cache),
        "disk_bytes_to_use": "16MiB",
    }
    tiny_model.save_pretrained(checkpoint)
    first = in_child(str(checkpoint), cfg)  # revision 1 fills the disk tier
    other_model.save_pretrained(checkpoint)  # revision 2, same name, same config
    expect_other = serve(str(checkpoint), None).outs
    other = serve(str(checkpoint), cfg)
    assert other.outs == expect_other, "revision 2 was served revision 1's KV"
    assert other.hits == {}
    tiny_model.save_pretrained(checkpoint)  # revision 1 again: its blocks are still there
    again = serve(str(checkpoint), cfg)
    assert again.outs == first
    assert again.covered == len(PROMPTS), "a page revision 1 stored was recomputed"
    assert set(again.hits) == {Medium.DISK}
    assert again.hits[Medium.DISK] + again.gpu_hits == sum((len(p) - 1) // PAGE for p in PROMPTS)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", ["--maxmemory", "64mb"]).start()
    yield server
    server.stop()


def test_other_weights_never_hit_a_shared_redis(
    tiny_model: PreTrainedModel, other_model: PreTrainedModel, redis_server: RedisServer
) -> None:
    cfg = {
        "cpu_bytes_to_use": 256 * PAGE_BYTES,
        "block_size": PAGE,
        "remote_url": redis_server.url,
        "remote_timeout_s": 2.0,
    }
    first = in_child(0, cfg)  # seed 0 = tiny_model's weights, built in another process
    expect_other = serve(other_model, None).outs
    other = serve(other_model, cfg)
    assert other.outs == expect_other
    assert other.hits == {}
    again = serve(tiny_model, cfg)
    assert again.outs == first
    assert again.covered == len(PROMPTS), "a page the other process stored was recomputed"
    assert set(again.hits) == {Medium.REMOTE}
    total = sum((len(p) - 1) // PAGE for p in PROMPTS)
    assert again.hits[Medium.REMOTE] + again.gpu_hits == total
