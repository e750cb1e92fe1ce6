"""kvtier's disk and Redis tiers under vLLM 0.33's own TieringOffloadingSpec.

vLLM's factory builds the tiers from ``secondary_tiers`` by ``type`` and ``module_path``;
vLLM's TieringOffloadingManager drives them (cascades after stores, promotions on
lookups). Bytes are written into vLLM's CPU tier rows as its worker would, and must
come back identical from disk and from Redis, in a new engine; a tampered disk block
is refused and becomes a miss.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


class Engine:
    """vLLM's tiering manager over kvtier's tiers (the scheduler side of one engine)."""

    def __init__(self, model_dir: Path, tiers: list[dict[str, Any]], engine_id: str) -> None:
        from tests.integrations.vllm_harness import BLOCK, HEAD, LAYERS

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
                build_offloading_config,
            )
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.kv_cache_interface import (
                FullAttentionSpec,
                KVCacheConfig,
                KVCacheGroupSpec,
            )
            from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 64 * 16384,
            "secondary_tiers": tiers,
        }
        args = EngineArgs(
            model=str(model_dir),
            skip_tokenizer_init=True,
            block_size=BLOCK,
            enable_prefix_caching=True,
            max_model_len=1024,
            dtype="float32",
            kv_transfer_config={
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "engine_id": engine_id,
                "kv_connector_extra_config": extra,
            },
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = args.create_engine_config()
        kvc = KVCacheConfig(
            num_blocks=16,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
                    FullAttentionSpec(
                        block_size=BLOCK, num_kv_heads=2, head_size=HEAD, dtype=torch.float32
                    ),
                )
            ],
        )
        self.spec = OffloadingSpecFactory.create_spec(build_offloading_config(cfg, kvc))
        self.manager = self.spec.get_manager()
        view = self.manager.primary_tier.get_kv_memoryview()
        self.rows = np.frombuffer(view, dtype=np.uint8).reshape(-1, view.strides[0])

    def call(self, name: str, *args: Any) -> Any:
        with self.manager.lock:
            return getattr(self.manager, name)(*args)

    def settle(self, timeout_s: float = 30.0) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext

        deadline = time.monotonic() + timeout_s
        while True:
            self.call("on_schedule_end", ScheduleEndContext((), ()))
            if not self.call("has_pending_work"):
                return
            assert time.monotonic() < deadline, "tier jobs did not finish"
            time.sleep(0.01)

    def lookup_until_settled(self, key: Any, ctx: Any, timeout_s: float = 30.0) -> Any:
        from vllm.v1.kv_offload.base import LookupResult

        deadline = time.monotonic() + timeout_s
        seen = []
        while True:
            result = self.call("lookup", key, ctx)
            seen.append(result)
            if result in (LookupResult.HIT, LookupResult.MISS):
                return result, seen
            assert time.monotonic() < deadline, f"lookup never settled: {seen[-5:]}"
            self.settle()

    def shutdown(self) -> None:
        self.manager.shutdown()


def keys_and_payloads(n: int, row_bytes: int) -> tuple[list[Any], list[np.ndarray]]:
    from vllm.v1.kv_offload.base import make_offload_key

    keys = [make_offload_key(hashlib.sha256(b"block %d" % i).digest(), 0) for i in range(n)]
    rng = np.random.default_rng(7)
    payloads = [rng.integers(0, 256, size=row_bytes, dtype=np.uint8) for _ in range(n)]
    return keys, payloads


def store(engine: Engine, keys: list[Any], payloads: list[np.ndarray]) -> None:
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id="writer")
    engine.call("on_new_request", ctx)
    out = engine.call("prepare_store", keys, ctx)
    assert list(out.keys_to_store) == keys
    for chunk, payload in zip(out.store_spec.block_ids, payloads, strict=True):
        engine.rows[int(chunk)] = payload  # what vLLM's worker writes
    engine.call("complete_store", keys, ctx)
    engine.settle()  # cascades to the secondary tiers
    engine.call("on_request_finished", ctx)


def load(engine: Engine, keys: list[Any], req_id: str) -> tuple[list[Any], list[bytes]]:
    """Look every key up until it settles; load the hits; their bytes."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    ctx = ReqContext(req_id=req_id)
    engine.call("on_new_request", ctx)
    results = [engine.lookup_until_settled(k, ctx)[0] for k in keys]
    hits = [k for k, r in zip(keys, results, strict=True) if r is LookupResult.HIT]
    spec = engine.call("prepare_load", hits, ctx)
    data = [bytes(engine.rows[int(c)]) for c in spec.block_ids]
    engine.call("complete_load", hits, ctx)
    engine.call("on_request_finished", ctx)
    return results, data


def test_blocks_come_back_from_kvtiers_disk_and_redis_tiers(
    model_dir: Path, tmp_path: Path, redis_server: RedisServer
) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    disk = {
        "type": "KvtierDiskTier",
        "module_path": "kvtier.integrations.vllm",
        "disk_path": str(tmp_path / "disk"),
        "disk_bytes_to_use": "8MiB",
    }
    redis = {
        "type": "KvtierRedisTier",
        "module_path": "kvtier.integrations.vllm",
        "remote_url": redis_server.url,
    }
    pid = os.getpid()
    first = Engine(model_dir, [disk, redis], f"kvtier-tiering-a-{pid}")
    try:
        keys, payloads = keys_and_payloads(6, first.rows.shape[1])
        store(first, keys, payloads)
        tiers = first.manager.secondary_tiers
        assert [type(t).__name__ for t in tiers] == ["KvtierDiskTier", "KvtierRedisTier"]
        assert [len(t.index) for t in tiers] == [6, 6]
    finally:
        first.shutdown()

    # A new engine over the same directory, one block tampered on disk.
    from kvtier.media.disk_layout import HEADER_REGION, LAYOUT, find_block

    (fp_dir,) = list((tmp_path / "disk" / LAYOUT).iterdir())
    where = find_block(fp_dir, bytes(keys[3]))
    assert where is not None
    with open(where[0], "r+b") as f:  # a payload byte of its slot
        f.seek(where[1] + HEADER_REGION + 100)
        byte = f.read(1)[0]
        f.seek(where[1] + HEADER_REGION + 100)
        f.write(bytes([byte ^ 0xFF]))
    second = Engine(model_dir, [disk], f"kvtier-tiering-b-{pid}")
    try:
        results, data = load(second, keys, "reader")
        want = [LookupResult.HIT] * 6
        want[3] = LookupResult.MISS  # refused by its checksum, forgotten: a miss
        assert results == want
        assert data == [bytes(p) for i, p in enumerate(payloads) if i != 3]
    finally:
        second.shutdown()

    # A third engine sharing only the Redis server.
    third = Engine(model_dir, [redis], f"kvtier-tiering-c-{pid}")
    try:
        results, data = load(third, keys, "reader")
        assert results == [LookupResult.HIT] * 6
        assert data == [bytes(p) for p in payloads]
    finally:
        third.shutdown()


def test_tier_config_errors_name_the_key(model_dir: Path, tmp_path: Path) -> None:
    from kvtier.errors import ConfigError

    bad = {
        "type": "KvtierDiskTier",
        "module_path": "kvtier.integrations.vllm",
        "disk_path": str(tmp_path),
        "disk_bytes_to_use": "8MiB",
        "disk_treads": 2,
    }
    with pytest.raises(ConfigError) as err:
        Engine(model_dir, [bad], f"kvtier-tiering-bad-{os.getpid()}")
    assert err.value.key == "disk_treads"
