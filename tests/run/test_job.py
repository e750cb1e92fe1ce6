"""The runner end to end on a tiny model, and the outputs check."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from transformers import PreTrainedModel

from kvtier.engine import LLM
from kvtier.engine.connector_api import OffloadStats
from kvtier.run.configs import Configuration, TierSizes, build_configurations
from kvtier.run.job import ConfigRun, TurnResult, compare_outputs, run_job
from kvtier.run.workload import Chat, generate_workload
from tests.tiny import TINY

from .conftest import TINY_WORKLOAD

BLOCK = 4


def _pool(max_request_tokens: int) -> int:
    return -(-max_request_tokens // BLOCK) + 2  # the largest turn, barely


def test_runner_replays_the_chat_exactly_as_a_plain_engine_would(
    tiny_model: PreTrainedModel,
) -> None:
    workload = generate_workload(TINY_WORKLOAD, TINY.vocab_size)
    pool = _pool(workload.max_request_tokens)
    progress = io.StringIO()
    (run,) = run_job(tiny_model, workload, [Configuration("none", None)], pool, BLOCK, progress)
    assert [(t.conversation, t.turn) for t in run.turns] == [
        (t.conversation, t.index) for t in workload.turns
    ]
    # The same turns through a fresh engine by hand: same prompts, same tokens.
    llm = LLM(model=tiny_model, num_gpu_blocks=pool, block_size=BLOCK)
    chat = Chat(workload)
    for planned, result in zip(workload.turns, run.turns, strict=True):
        prompt = chat.prompt(planned)
        output = llm.generate([prompt], max_new_tokens=planned.answer_tokens)[0]
        chat.record(planned, output)
        assert result.output == tuple(output)
        assert result.prompt_tokens == len(prompt) == planned.prompt_tokens
        assert result.history_tokens == planned.history_tokens
        assert 0 <= result.gpu_hit_tokens < result.prompt_tokens
        assert result.computed_tokens == result.prompt_tokens - result.gpu_hit_tokens
        assert result.offload_hit_tokens == {} and result.loaded_blocks == 0
        assert result.ttft_s > 0
    assert run.totals.bytes_loaded == run.totals.bytes_stored == 0
    lines = progress.getvalue().splitlines()
    assert len(lines) == len(workload.turns)
    assert lines[-1].startswith(f"[{len(workload.turns):>3}/{len(workload.turns)}]")
    # The shared system prompt is hit in the GPU prefix cache at least once.
    assert any(t.gpu_hit_tokens >= TINY_WORKLOAD.system_tokens // BLOCK * BLOCK for t in run.turns)


def test_identical_engines_give_identical_outputs(tiny_model: PreTrainedModel) -> None:
    workload = generate_workload(TINY_WORKLOAD, TINY.vocab_size)
    configs = [Configuration("a", None), Configuration("b", None)]
    runs = run_job(tiny_model, workload, configs, _pool(workload.max_request_tokens), BLOCK, None)
    assert [r.config.name for r in runs] == ["a", "b"]
    assert compare_outputs(runs) == ()


def _turn(conv: int, index: int, out: tuple[int, ...]) -> TurnResult:
    return TurnResult(conv, index, 10, 5, 0.1, 0, {}, 0, 10, out)


def test_compare_outputs_names_the_first_differing_token() -> None:
    base = ConfigRun(Configuration("none", None), (_turn(0, 0, (1, 2, 3)), _turn(1, 0, (4, 5))))
    same = ConfigRun(Configuration("cpu", {}), (_turn(0, 0, (1, 2, 3)), _turn(1, 0, (4, 5))))
    diff = ConfigRun(Configuration("disk", {}), (_turn(0, 0, (1, 2, 3)), _turn(1, 0, (4, 6))))
    assert compare_outputs([base, same]) == ()
    (m,) = compare_outputs([base, same, diff])
    assert (m.config, m.baseline, m.conversation, m.turn, m.position) == ("disk", "none", 1, 0, 1)
    shorter = ConfigRun(Configuration("s", {}), (_turn(0, 0, (1, 2)), _turn(1, 0, (4, 5))))
    assert compare_outputs([base, shorter])[0].position == 2


def test_runner_refuses_a_pool_too_small_for_a_turn(tiny_model: PreTrainedModel) -> None:
    from kvtier.errors import CapacityError

    workload = generate_workload(TINY_WORKLOAD, TINY.vocab_size)
    with pytest.raises(CapacityError):
        run_job(tiny_model, workload, [Configuration("none", None)], 2, BLOCK, None)


def test_offloading_serves_late_turns_and_changes_no_token(
    tiny_model: PreTrainedModel, tmp_path: Path
) -> None:
    workload = generate_workload(TINY_WORKLOAD, TINY.vocab_size)
    block_bytes = 2 * TINY.num_layers * TINY.num_kv_heads * 16 * 4 * BLOCK  # 16 = head dim
    kv_bytes = workload.distinct_tokens() // BLOCK * block_bytes
    sizes = TierSizes(cpu_bytes_with_disk=24 * block_bytes)  # CPU too small: disk serves
    configs = build_configurations(
        ("none", "cpu", "cpu+disk"), kv_bytes, BLOCK, str(tmp_path / "disk"), sizes
    )
    runs = run_job(tiny_model, workload, configs, _pool(workload.max_request_tokens), BLOCK, None)
    assert compare_outputs(runs) == ()
    none, cpu, disk = runs
    assert none.totals == OffloadStats()
    for run, tier in ((cpu, "CPU"), (disk, "DISK")):
        assert run.totals.hit_blocks.get(tier, 0) > 0
        assert run.totals.bytes_loaded > 0 and run.totals.bytes_stored > 0
        assert run.totals.failed_loads == run.totals.failed_stores == 0
        assert sum(t.loaded_blocks for t in run.turns) == run.totals.loaded_blocks
        # Every prompt token is a GPU hit, an offloaded hit, or computed.
        for t in run.turns:
            offloaded = t.loaded_blocks * BLOCK
            assert t.gpu_hit_tokens + offloaded + t.computed_tokens == t.prompt_tokens
    # Offloaded hits replace computation: fewer prompt tokens computed than without.
    assert sum(t.computed_tokens for t in cpu.turns) < sum(t.computed_tokens for t in none.turns)
