"""The workload generator's shapes: what each one holds, and that seeds repeat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.sim.workload import SHAPES, WorkloadConfig, generate, shaped


def _small(shape: str, seed: int = 1) -> WorkloadConfig:
    return replace(shaped(shape, seed, block_size=16), requests=400)


def test_mixed_is_the_default_configuration() -> None:
    assert shaped("mixed", 4) == WorkloadConfig(seed=4)


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_repeats_for_a_seed(shape: str) -> None:
    assert generate(_small(shape)).requests == generate(_small(shape)).requests
    assert generate(_small(shape)).requests != generate(_small(shape, 2)).requests


def test_agents_share_few_long_tool_prompts_and_extend_their_history() -> None:
    cfg = _small("agents")
    trace = generate(cfg)
    heads = {r.hash_ids[0] for r in trace.requests}
    # agent steps start at one of 6 tool prompts; chat turns at one of 20 system prompts
    assert len(heads) <= cfg.tool_prompts + cfg.system_prompts
    long_heads = {r.hash_ids[0] for r in trace.requests if len(r.hash_ids) >= 12}
    assert 1 <= len(long_heads & heads) <= cfg.tool_prompts + cfg.system_prompts
    # most requests re-send a prefix seen before (the history) plus new blocks
    seen: set[int] = set()
    extending = 0
    for r in trace.requests:
        extending += r.hash_ids[0] in seen
        seen.update(r.hash_ids)
    assert extending / len(trace.requests) > 0.9


def test_chat_has_no_documents_and_documents_no_chats() -> None:
    chat, docs = generate(_small("chat")), generate(_small("documents"))
    cfg = _small("chat")
    assert max(len(r.hash_ids) for r in chat.requests) <= (
        cfg.system_prompt_blocks + cfg.max_turns * cfg.turn_blocks[1]
    )
    assert min(len(r.hash_ids) for r in docs.requests) >= cfg.doc_blocks[0] + 1


def test_unknown_shape() -> None:
    with pytest.raises(ValueError, match="unknown workload shape"):
        shaped("video", 1)
