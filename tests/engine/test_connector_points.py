"""The connector points, exercised by an in-memory connector that really moves KV bytes.

``DictConnector`` keeps copies of pages in a dict: it stores at (c) ``on_blocks_full``
(eager) or at (d) ``on_gpu_evict`` (on_evict), answers (a) from the dict, and loads at
(b) ``start_load``, completing in (e) ``poll`` -- late, partially, or with garbage in
the pages it failed to load. Whatever it does, greedy outputs must not change.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from kvtier.blocks import BlockHash, BlockId
from kvtier.engine import LLM, Connector, LoadHandle, NoOpConnector, OffloadStats
from kvtier.engine.request import Request

BLOCK = 4


class DictConnector:
    def __init__(
        self,
        policy: str,
        load_ok_blocks: int | None = None,
        load_delay_polls: int = 0,
        hold_finished: bool = False,
    ) -> None:
        self.policy = policy
        self.load_ok_blocks = load_ok_blocks
        self.load_delay_polls = load_delay_polls
        self.hold_finished = hold_finished
        self.kv: list[torch.Tensor] = []
        self.store: dict[BlockHash, list[torch.Tensor]] = {}
        self.full_pages: dict[BlockHash, list[torch.Tensor]] = {}
        self.pending: list[tuple[LoadHandle, Sequence[BlockHash], Sequence[BlockId], int]] = []
        self.held: list[str] = []
        self.events: list[str] = []
        self.loaded = self.failed = self.stored = 0

    def _page(self, block_id: BlockId) -> list[torch.Tensor]:
        return [t[:, block_id].clone() for t in self.kv]

    def register_kv_caches(self, kv_caches: Sequence[torch.Tensor], block_size: int) -> None:
        assert block_size == BLOCK and not self.kv
        self.kv = list(kv_caches)

    def get_num_external_hit_blocks(
        self, request: Request, block_keys: Sequence[BlockHash], num_gpu_hit_blocks: int
    ) -> int:
        self.events.append("a")
        n = 0
        for key in block_keys[num_gpu_hit_blocks:]:
            if key not in self.store:
                break
            n += 1
        return n

    def start_load(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> LoadHandle:
        self.events.append("b")
        assert len(block_keys) == len(gpu_block_ids) > 0
        handle = LoadHandle(len(block_keys))
        self.pending.append((handle, block_keys, gpu_block_ids, self.load_delay_polls))
        return handle

    def on_blocks_full(
        self, request: Request, block_keys: Sequence[BlockHash], gpu_block_ids: Sequence[BlockId]
    ) -> None:
        self.events.append("c")
        for key, block_id in zip(block_keys, gpu_block_ids, strict=True):
            self.full_pages[key] = self._page(block_id)
            if self.policy == "eager":
                self._store(key, block_id)

    def on_gpu_evict(self, block_key: BlockHash, gpu_block_id: BlockId) -> None:
        self.events.append("d")
        # Called before reuse: the page still holds exactly the block it was named for.
        if block_key in self.full_pages:
            for now, then in zip(self._page(gpu_block_id), self.full_pages[block_key], strict=True):
                assert torch.equal(now, then)
        if self.policy == "on_evict":
            self._store(block_key, gpu_block_id)

    def _store(self, key: BlockHash, block_id: BlockId) -> None:
        if key not in self.store:
            self.store[key] = self._page(block_id)
            self.stored += 1

    def poll(self) -> Sequence[str]:
        still = []
        for handle, keys, ids, delay in self.pending:
            if delay:
                still.append((handle, keys, ids, delay - 1))
                continue
            ok = len(keys) if self.load_ok_blocks is None else min(self.load_ok_blocks, len(keys))
            for i, (key, block_id) in enumerate(zip(keys, ids, strict=True)):
                for layer, t in enumerate(self.kv):
                    if i < ok:
                        t[:, block_id].copy_(self.store[key][layer])
                    else:  # a failed transfer leaves garbage behind
                        t[:, block_id].normal_()
            self.loaded += ok
            self.failed += len(keys) - ok
            handle.complete(ok)
        self.pending = still
        released, self.held = self.held, []
        return released

    def request_finished(self, request: Request, gpu_block_ids: Sequence[BlockId]) -> bool:
        self.events.append("f")
        if self.hold_finished:
            self.held.append(request.request_id)
        return self.hold_finished

    def close(self) -> None:
        return None

    def take_stats(self) -> OffloadStats:
        stats = OffloadStats(
            loaded_blocks=self.loaded, stored_blocks=self.stored, failed_loads=self.failed
        )
        self.loaded = self.failed = self.stored = 0
        return stats


def conversation(model, turns: int, seed: int) -> list[list[int]]:
    """Prompts of a multi-turn chat (each resends the history), made by a fresh engine."""
    rng = random.Random(seed)
    system = [rng.randrange(512) for _ in range(21)]
    history: list[int] = list(system)
    prompts = []
    for _ in range(turns):
        history += [rng.randrange(512) for _ in range(rng.randint(3, 9))]
        prompts.append(list(history))
        (out,) = LLM(model, num_gpu_blocks=128, block_size=BLOCK).generate([history], 6)
        history += out
    return prompts


@pytest.fixture(scope="module")
def chats(tiny_model) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Three conversations of four turns, and each prompt's from-scratch output."""
    convs = [conversation(tiny_model, 4, seed) for seed in range(3)]
    expected = {
        tuple(p): LLM(tiny_model, num_gpu_blocks=128, block_size=BLOCK).generate([p], 6)[0]
        for conv in convs
        for p in conv
    }
    return convs, [expected[tuple(p)] for turn in zip(*convs, strict=True) for p in turn]


def serve(model, connector: Connector, convs: list[list[list[int]]]) -> tuple[list, list]:
    """Turn by turn, all conversations at once, in a pool too small to keep them."""
    llm = LLM(model, num_gpu_blocks=24, block_size=BLOCK, max_batch_size=2, connector=connector)
    outputs, stats = [], []
    for turn in zip(*convs, strict=True):
        outputs += llm.generate(list(turn), 6)
        stats.append(llm.last_stats)
    return outputs, stats


@pytest.mark.parametrize("policy", ["eager", "on_evict"])
def test_loads_replace_recompute_with_the_same_tokens(tiny_model, chats, policy: str) -> None:
    convs, expected = chats
    connector = DictConnector(policy)
    outputs, stats = serve(tiny_model, connector, convs)
    assert outputs == expected
    loaded = sum(r.loaded_blocks for s in stats for r in s.requests)
    assert loaded > 0 and sum(s.offload.loaded_blocks for s in stats) == loaded
    assert all(r.loaded_blocks == r.external_hit_blocks for s in stats for r in s.requests)
    assert {"a", "b", "c", "d", "f"} <= set(connector.events)


@pytest.mark.parametrize("ok_blocks", [0, 1])
def test_failed_loads_are_recomputed(tiny_model, chats, ok_blocks: int) -> None:
    convs, expected = chats
    connector = DictConnector("eager", load_ok_blocks=ok_blocks)
    outputs, stats = serve(tiny_model, connector, convs)
    assert outputs == expected
    assert sum(s.offload.failed_loads for s in stats) > 0
    for r in (r for s in stats for r in s.requests):
        assert r.loaded_blocks == min(ok_blocks, r.external_hit_blocks)


def test_slow_loads_and_held_pages(tiny_model, chats) -> None:
    convs, expected = chats
    connector = DictConnector("on_evict", load_delay_polls=3, hold_finished=True)
    outputs, stats = serve(tiny_model, connector, convs)
    assert outputs == expected
    assert sum(r.loaded_blocks for s in stats for r in s.requests) > 0


def test_no_op_connector_is_a_connector() -> None:
    assert isinstance(NoOpConnector(), Connector)
    assert isinstance(DictConnector("eager"), Connector)
    assert NoOpConnector().take_stats() == OffloadStats()
