"""The engine end to end: greedy outputs never depend on what was cached or evicted."""

from __future__ import annotations

import pytest

from kvtier.engine import LLM
from kvtier.engine.connector_api import NoOpConnector
from kvtier.errors import CapacityError, ConfigError

BLOCK = 4


def from_scratch(model, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Each prompt alone in a fresh engine with room to spare: nothing is ever a hit."""
    return [
        LLM(model, num_gpu_blocks=128, block_size=BLOCK).generate([p], max_new)[0] for p in prompts
    ]


def test_prefix_hits_give_the_same_tokens(tiny_model, make_prompts) -> None:
    prompts = make_prompts(seed=1, n=12, shared=23, tail=(1, 30))
    expected = from_scratch(tiny_model, prompts, 10)
    llm = LLM(tiny_model, num_gpu_blocks=256, block_size=BLOCK)
    assert llm.generate(prompts, 10) == expected
    first = llm.last_stats
    assert first is not None
    # The 23-token prefix is 5 full blocks: every prompt after the first hits them.
    assert [r.gpu_hit_blocks for r in first.requests][1:] == [5] * 11
    # Again: now each whole prompt (all full blocks but the one holding its last token) hits.
    assert llm.generate(prompts, 10) == expected
    again = llm.last_stats
    assert again is not None
    for r, p in zip(again.requests, prompts, strict=True):
        assert r.gpu_hit_blocks == (len(p) - 1) // BLOCK
        assert r.computed_tokens == len(p) - r.gpu_hit_blocks * BLOCK
    assert again.gpu_hit_tokens == sum(r.gpu_hit_blocks for r in again.requests) * BLOCK
    assert len(again.ttft_s) == 12 and all(t >= 0 for t in again.ttft_s)


def test_outputs_extend_the_cache_for_the_next_turn(tiny_model, make_prompts) -> None:
    (prompt,) = make_prompts(seed=2, n=1, shared=0, tail=(18, 18))
    llm = LLM(tiny_model, num_gpu_blocks=64, block_size=BLOCK)
    (out,) = llm.generate([prompt], 12)
    turn2 = prompt + out + [5, 6, 7]
    assert llm.generate([turn2], 6) == from_scratch(tiny_model, [turn2], 6)
    stats = llm.last_stats
    assert stats is not None
    # Generated tokens' full blocks were cached too (the last sampled one has no KV).
    assert stats.requests[0].gpu_hit_blocks == (len(prompt) + len(out) - 1) // BLOCK


@pytest.mark.parametrize("num_gpu_blocks", [14, 20, 40])
def test_a_small_pool_evicts_preempts_and_recomputes_exactly(
    tiny_model, make_prompts, num_gpu_blocks: int
) -> None:
    prompts = make_prompts(seed=3, n=10, shared=17, tail=(5, 25))
    expected = from_scratch(tiny_model, prompts, 12)
    llm = LLM(tiny_model, num_gpu_blocks=num_gpu_blocks, block_size=BLOCK, max_batch_size=4)
    for _ in range(2):
        assert llm.generate(prompts, 12) == expected
    stats = llm.last_stats
    assert stats is not None
    total_computed = sum(r.computed_tokens for r in stats.requests)
    assert total_computed > sum(len(p) for p in prompts) - stats.gpu_hit_tokens - 1
    if num_gpu_blocks == 14:
        assert any(r.preemptions for r in stats.requests)


def test_chunked_prefill_and_batch_size_one_agree(tiny_model, make_prompts) -> None:
    prompts = make_prompts(seed=4, n=4, shared=9, tail=(20, 40))
    expected = from_scratch(tiny_model, prompts, 8)
    llm = LLM(tiny_model, num_gpu_blocks=128, block_size=BLOCK, prefill_chunk=7, max_batch_size=1)
    assert llm.generate(prompts, 8) == expected


def test_one_token_prompt_and_block_aligned_prompts(tiny_model) -> None:
    prompts = [[3], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]
    expected = from_scratch(tiny_model, prompts, 5)
    llm = LLM(tiny_model, num_gpu_blocks=32, block_size=BLOCK)
    assert llm.generate(prompts, 5) == expected
    assert llm.generate(prompts, 5) == expected
    stats = llm.last_stats
    assert stats is not None
    assert [r.gpu_hit_blocks for r in stats.requests] == [0, 0, 1]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"block_size": -1}, "block_size"),
        ({"block_size": 2.5}, "block_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"offload": "8GiB"}, "offload"),
        ({"offload": {"cpu_bytes_to_use": 1 << 30}, "connector": NoOpConnector()}, "offload"),
        ({"connector": object()}, "connector"),
    ],
)
def test_bad_engine_arguments(tiny_model, kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        LLM(tiny_model, **kwargs)
    assert e.value.key == key


@pytest.mark.parametrize(
    ("prompts", "max_new", "key"),
    [
        ([[1, 2]], 0, "max_new_tokens"),
        ([[1, 2]], 1.0, "max_new_tokens"),
        ([[]], 3, "prompt_token_ids[0]"),
        ([[1], [1, 512]], 3, "prompt_token_ids[1]"),
        ([[1, -1]], 3, "prompt_token_ids[0]"),
        ([[1, "a"]], 3, "prompt_token_ids[0]"),
        (["abc"], 3, "prompt_token_ids[0]"),
        ("abc", 3, "prompt_token_ids"),
    ],
)
def test_bad_generate_arguments(tiny_model, prompts, max_new, key: str) -> None:
    llm = LLM(tiny_model, num_gpu_blocks=16, block_size=BLOCK)
    with pytest.raises(ConfigError) as e:
        llm.generate(prompts, max_new)
    assert e.value.key == key


def test_a_request_bigger_than_the_pool_is_refused_before_anything_runs(tiny_model) -> None:
    llm = LLM(tiny_model, num_gpu_blocks=4, block_size=BLOCK)
    with pytest.raises(CapacityError, match="raise num_gpu_blocks"):
        llm.generate([[1, 2], list(range(16))], 2)
    # Nothing was queued: the engine still serves.
    assert llm.generate([[1, 2]], 3) == from_scratch(tiny_model, [[1, 2]], 3)


def test_missing_checkpoint_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        LLM(tmp_path / "nope")
