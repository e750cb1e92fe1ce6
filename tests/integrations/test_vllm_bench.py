"""``kvtier bench vllm`` end to end on vLLM's CPU build, on the tiny model.

A smoke run of the serving benchmark (two configurations, a few turns): it starts the
servers, replays the chats over the OpenAI API, checks every answer against vLLM
alone and writes its JSON. The figures in ``docs/vllm.md`` come from the full run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.vllm_support import require_vllm_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_short_serving_run_answers_alike_and_stores_through_kvtier(tmp_path: Path) -> None:
    require_vllm_engine()
    from kvtier import cli
    from tests.integrations.vllm_engine import PAGE_BYTES, build_model

    build_model(tmp_path / "model")
    out = tmp_path / "bench.json"
    servers = tmp_path / "servers"  # made by the benchmark; left empty
    argv = ["bench", "vllm", "--configs", "cpu", "--conversations", "3", "--turns", "2"]
    argv += ["--user-tokens", "64", "--answer-tokens", "4", "--gpu-blocks", "6", "--rate", "4"]
    argv += ["--model", str(tmp_path / "model"), "--workdir", str(servers), "--json", str(out)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "vllm" and doc["config"]["configs"] == ["none", "cpu"]
    none, cpu = doc["results"]
    assert (none["config"], cpu["config"]) == ("none", "cpu")
    assert none["requests"] == cpu["requests"] == 6
    assert cpu["answers_equal_none"] is True
    assert none["kv_offload_store_bytes"] == 0
    stored = cpu["kv_offload_store_bytes"]
    assert stored > 0 and stored % PAGE_BYTES == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "model", "servers"]
    assert list(servers.iterdir()) == []
