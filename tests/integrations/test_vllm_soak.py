"""``kvtier soak --engine vllm``: vLLM's real server with kvtier under every fault kind.

Runs in the vLLM 0.32 environment, bounded: every fault kind of the soak is injected
once (Redis killed and stopped, block files flipped, torn and wiped, the disk full,
the server SIGKILLed and restarted over the same disk directory, once on a full disk),
and every completion is compared with a server without the connector. Longer runs
are by hand (``docs/soak.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.soak.faults import FAULT_KINDS
from tests.integrations.vllm_support import require_vllm_engine
from tests.redis_server import require_redis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_a_vllm_soak_injects_every_fault_and_serves_every_completion_right(
    tmp_path: Path,
) -> None:
    require_vllm_engine()
    require_redis()
    from kvtier.cli import main

    out = tmp_path / "soak.json"
    argv = ["soak", "--engine", "vllm", "--duration", "20", "--fault-interval", "1"]
    assert main([*argv, "--seed", "1", "--json", str(out), "--workdir", str(tmp_path)]) == 0
    figures = json.loads(out.read_text())["results"]
    assert all(figures["faults"][kind] >= 1 for kind in FAULT_KINDS), figures["faults"]
    assert figures["wrong_tokens"] == 0 and figures["wrong_completions"] == 0
    assert figures["server_crashes"] == 0
    assert figures["corrupt_blocks_at_end"] == 0
    assert figures["requests_served"] > 0
    assert figures["tokens_compared"] == 8 * figures["requests_served"]
    kills = figures["faults"]["engine_kill"] + figures["faults"]["engine_kill_full_disk"]
    assert figures["server_restarts"] == kills
    assert list(tmp_path.iterdir()) == [out], "the soak left its scratch directory behind"
