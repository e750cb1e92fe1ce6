"""Property: whatever the pool size, batch size, chunking and sharing, greedy tokens are
those of each prompt computed alone from scratch."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.engine import LLM

BLOCK = 4
MAX_NEW = 5
_alone: dict[tuple[int, ...], list[int]] = {}


def alone(model, prompt: list[int]) -> list[int]:
    key = tuple(prompt)
    if key not in _alone:
        llm = LLM(model, num_gpu_blocks=64, block_size=BLOCK)
        _alone[key] = llm.generate([prompt], MAX_NEW)[0]
    return _alone[key]


# Prompts are built from a few shared stems, so that they share prefixes of every length.
stems = st.lists(st.integers(0, 511), min_size=1, max_size=20)


@pytest.mark.timeout(900)  # 60 engine runs: 76 s alone on a loaded 2-core machine
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(),
    stem_list=st.lists(stems, min_size=1, max_size=3),
    num_gpu_blocks=st.integers(12, 40),
    max_batch_size=st.integers(1, 4),
    prefill_chunk=st.integers(1, 24),
)
def test_any_schedule_gives_the_tokens_of_each_prompt_alone(
    tiny_model, data, stem_list, num_gpu_blocks, max_batch_size, prefill_chunk
) -> None:
    prompts = []
    for _ in range(data.draw(st.integers(1, 6))):
        stem = data.draw(st.sampled_from(stem_list))
        cut = data.draw(st.integers(1, len(stem)))
        tail = data.draw(st.lists(st.integers(0, 511), max_size=12))
        prompts.append(stem[:cut] + tail)
    llm = LLM(
        tiny_model,
        num_gpu_blocks=num_gpu_blocks,
        block_size=BLOCK,
        max_batch_size=max_batch_size,
        prefill_chunk=prefill_chunk,
    )
    expected = [alone(tiny_model, p) for p in prompts]
    assert llm.generate(prompts, MAX_NEW) == expected
    assert llm.generate(prompts[::-1], MAX_NEW) == expected[::-1]
