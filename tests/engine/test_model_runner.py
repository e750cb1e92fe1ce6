"""The model runner is numerically faithful to the plain Hugging Face forward pass."""

from __future__ import annotations

import random

import pytest
import torch

from kvtier.blocks import BlockId
from kvtier.engine.hf_compat import cache_from_past, cache_keyword, layer_kv
from kvtier.engine.kv_pool import KVPool, KVShape
from kvtier.engine.model_runner import ModelRunner, SeqInput
from kvtier.errors import ProtocolError

BLOCK = 4


def make_runner(model, num_blocks: int = 64) -> ModelRunner:
    pool = KVPool(KVShape.of_model(model), num_blocks, BLOCK, torch.device("cpu"))
    return ModelRunner(model, pool)


def table(first: int, n: int) -> tuple[BlockId, ...]:
    # Deliberately not in order, so that slot arithmetic is exercised.
    return tuple(BlockId(first + i) for i in reversed(range(n)))


def hf_reference(model, tokens: list[int]):
    """Plain forward on the whole sequence: next greedy token, and its KV cache."""
    with torch.inference_mode():
        cache = cache_from_past([])
        out = model(
            input_ids=torch.tensor([tokens]), use_cache=True, **{cache_keyword(model): cache}
        )
    return int(out.logits[0, -1].argmax()), cache


@pytest.mark.parametrize("split", [0, 4, 13, 20, 36])
def test_prefill_over_cached_pages_matches_plain_forward(tiny_model, split: int) -> None:
    rng = random.Random(split)
    tokens = [rng.randrange(512) for _ in range(37)]
    ref_token, ref_cache = hf_reference(tiny_model, tokens)
    runner = make_runner(tiny_model)
    t = table(3, 10)
    if split:
        runner.run([SeqInput(t, 0, tuple(tokens[:split]))])
    assert runner.run([SeqInput(t, split, tuple(tokens[split:]))]) == [ref_token]
    slots = runner.pool.slots(t, 0, len(tokens))
    for layer in range(2):
        k, v = runner.pool.gather(layer, slots)
        ref_k, ref_v = layer_kv(ref_cache, layer)
        torch.testing.assert_close(k, ref_k[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, ref_v[0], rtol=1e-5, atol=1e-5)


def test_batched_decode_matches_one_at_a_time(tiny_model) -> None:
    rng = random.Random(0)
    seqs = [[rng.randrange(512) for _ in range(n)] for n in (5, 17, 30)]
    tables = [table(10 * i, 10) for i in range(3)]
    single = make_runner(tiny_model)
    batched = make_runner(tiny_model)
    for runner in (single, batched):
        for s, t in zip(seqs, tables, strict=True):
            runner.run([SeqInput(t, 0, tuple(s[:-1]))])
    expected = [
        single.run([SeqInput(t, len(s) - 1, (s[-1],))])[0]
        for s, t in zip(seqs, tables, strict=True)
    ]
    inputs = [SeqInput(t, len(s) - 1, (s[-1],)) for s, t in zip(seqs, tables, strict=True)]
    assert batched.run(inputs) == expected
    assert expected == [hf_reference(tiny_model, s)[0] for s in seqs]
    for layer in range(2):
        torch.testing.assert_close(single.pool.kv_caches[layer], batched.pool.kv_caches[layer])


def test_bad_batches_are_refused(tiny_model) -> None:
    runner = make_runner(tiny_model)
    with pytest.raises(ProtocolError, match="empty"):
        runner.run([])
    with pytest.raises(ProtocolError, match="same"):
        runner.run([SeqInput(table(0, 2), 0, (1, 2)), SeqInput(table(2, 2), 0, (3,))])
    with pytest.raises(ProtocolError, match="cannot hold"):
        runner.run([SeqInput(table(0, 1), 3, (1, 2))])
