"""A metrics backend that raises never changes a token or stops the engine.

Every counter increment and histogram observation of ``prometheus_client`` is made to
raise (as ``Counter.inc`` does for a negative amount). The engine must generate the
same tokens as with working metrics, count each recording call that failed -- exactly
one per ``generate`` call's stats, one per step's counters, one per finished job -- and
log each kind of failure once.
"""

from __future__ import annotations

import logging
from pathlib import Path

import prometheus_client
import pytest
from transformers import PreTrainedModel

from kvtier.engine import LLM
from kvtier.engine.offload_connector import OffloadingConnector

from .engine_run import GPU_BLOCKS, PAGE, chats, disk_cfg


def _generate_all(llm: LLM) -> list[list[int]]:
    return [llm.generate([prompt], max_new_tokens=4)[0] for prompt in chats()]


def _refuse(*args: object, **kwargs: object) -> None:
    raise ValueError("Counters can only be incremented by non-negative amounts.")


def test_a_raising_metrics_backend_changes_no_token_and_is_counted_exactly(
    tiny_model: PreTrainedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def engine(disk: str) -> LLM:
        return LLM(
            model=tiny_model,
            num_gpu_blocks=GPU_BLOCKS,
            block_size=PAGE,
            offload=disk_cfg(tmp_path / disk),
        )

    with engine("good") as llm:
        assert llm.metrics is not None, "this test needs prometheus_client installed"
        expected = _generate_all(llm)

    monkeypatch.setattr(prometheus_client.Counter, "inc", _refuse)
    monkeypatch.setattr(prometheus_client.Histogram, "observe", _refuse)
    caplog.set_level(logging.WARNING)
    jobs = 0

    def count(spec: object, result: object) -> None:
        nonlocal jobs
        jobs += 1

    with engine("bad") as llm:
        assert isinstance(llm.connector, OffloadingConnector)
        llm.connector.add_observer(count)
        got = _generate_all(llm)
        calls = len(got)
        # each generate call: its stats (1) and the step's manager counters (1); each job: 1
        assert jobs > 0
        assert llm.observability.recording_failures == 2 * calls + jobs
    assert got == expected
    logged = [r for r in caplog.records if "recording metrics failed" in r.getMessage()]
    assert len(logged) == 1, "each kind of failure is logged once"
