"""The GPU prefix cache: unit tests, and a stateful machine against a plain-dict model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.blocks import BlockHash, BlockId
from kvtier.engine.block_manager import BlockManager
from kvtier.errors import ProtocolError


def key(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(4, "little"))


def test_freed_blocks_stay_hits_until_evicted_lru() -> None:
    evicted: list[tuple[BlockHash, BlockId]] = []
    bm = BlockManager(4, on_evict=lambda k, b: evicted.append((k, b)))
    first = bm.allocate([], 2)
    for i, b in enumerate(first):
        assert bm.commit(b, key(i))
    bm.free(first)
    assert bm.lookup([key(0), key(1), key(2)]) == first
    # Two clean blocks are used before any cached one is evicted.
    other = bm.allocate([], 2)
    assert evicted == [] and set(other).isdisjoint(first)
    # Freed in reverse: the tail (key 1) is the least recently used, evicted first.
    (third,) = bm.allocate([], 1)
    assert evicted == [(key(1), first[1])] and third == first[1]
    assert bm.lookup([key(0), key(1)]) == [first[0]]


def test_hit_on_a_free_cached_block_takes_it_back() -> None:
    bm = BlockManager(2)
    (b,) = bm.allocate([], 1)
    bm.commit(b, key(7))
    bm.free([b])
    assert bm.num_free == 2
    assert bm.can_allocate([b], 1) and not bm.can_allocate([b], 2)
    assert bm.allocate([b], 1)[0] == b
    assert bm.ref_count(b) == 1 and bm.num_free == 0


def test_duplicate_key_keeps_the_first_block() -> None:
    bm = BlockManager(2)
    a, b = bm.allocate([], 2)
    assert bm.commit(a, key(1))
    assert not bm.commit(b, key(1))
    assert bm.key_of(b) is None and bm.lookup([key(1)]) == [a]


def test_protocol_errors_change_nothing() -> None:
    bm = BlockManager(2)
    (a,) = bm.allocate([], 1)
    with pytest.raises(ProtocolError, match="can_allocate"):
        bm.allocate([], 2)
    with pytest.raises(ProtocolError, match="no cached key"):
        bm.allocate([a], 0)
    bm.commit(a, key(1))
    with pytest.raises(ProtocolError, match="already holds"):
        bm.commit(a, key(2))
    with pytest.raises(ProtocolError, match="not in use"):
        bm.free([a, BlockId(1)])
    assert bm.ref_count(a) == 1 and bm.num_free == 1
    with pytest.raises(ProtocolError, match="twice"):
        bm.free([a, a])
    bm.free([a])
    with pytest.raises(ProtocolError, match="is free"):
        bm.commit(a, key(3))


NUM_BLOCKS = 6


class BlockManagerMachine(RuleBasedStateMachine):
    """Requests allocate (with hits), commit and free; the model is a few plain dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[tuple[BlockHash, BlockId]] = []
        self.bm = BlockManager(NUM_BLOCKS, on_evict=self._on_evict)
        self.refs: dict[int, int] = {}  # block -> ref count (absent = 0)
        self.keys: dict[BlockHash, int] = {}  # key -> block
        self.tables: list[list[BlockId]] = []  # live requests' blocks
        self.lru: list[int] = []  # free named blocks, least recently freed first
        self.next_key = 0

    def _on_evict(self, k: BlockHash, b: BlockId) -> None:
        # Called before reuse: the block is free and still named by k in the model.
        assert self.refs.get(b, 0) == 0, "evicted a block in use"
        assert self.keys.get(k) == b
        self.evicted.append((k, b))

    def _free_count(self) -> int:
        return NUM_BLOCKS - sum(1 for r in self.refs.values() if r > 0)

    @rule(num_new=st.integers(0, 4), hit_count=st.integers(0, 3))
    def allocate(self, num_new: int, hit_count: int) -> None:
        named = sorted(self.keys.items(), key=lambda kv: kv[1])[:hit_count]
        hits = [BlockId(b) for _, b in named]
        if len(set(hits)) != len(hits):
            return
        expected_ok = num_new + sum(1 for b in hits if self.refs.get(b, 0) == 0) <= (
            self._free_count()
        )
        assert self.bm.can_allocate(hits, num_new) == expected_ok
        if not expected_ok:
            with pytest.raises(ProtocolError):
                self.bm.allocate(hits, num_new)
            return
        self.evicted.clear()
        self.lru = [b for b in self.lru if b not in hits]
        named_blocks = set(self.keys.values())
        clean = sum(
            1 for b in range(NUM_BLOCKS) if self.refs.get(b, 0) == 0 and b not in named_blocks
        )
        table = self.bm.allocate(hits, num_new)
        assert table[: len(hits)] == hits
        # Clean blocks go first; then named ones are evicted in LRU order.
        n_evict = max(0, num_new - clean)
        assert [b for _, b in self.evicted] == self.lru[:n_evict]
        self.lru = self.lru[n_evict:]
        for k, b in self.evicted:
            assert self.keys.pop(k) == b
        for b in table:
            self.refs[b] = self.refs.get(b, 0) + 1
        fresh = table[len(hits) :]
        assert len(set(fresh)) == len(fresh)
        assert all(self.refs[b] == 1 for b in fresh), "handed out a block in use"
        assert all(b not in self.keys.values() for b in fresh)
        self.tables.append(table)

    @precondition(lambda self: any(self.tables))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        table = data.draw(st.sampled_from([t for t in self.tables if t]))
        b = data.draw(st.sampled_from(table))
        if self.bm.key_of(b) is not None:
            return
        reuse = data.draw(st.booleans()) and bool(self.keys)
        k = next(iter(self.keys)) if reuse else BlockHash(self.next_key.to_bytes(4, "little"))
        self.next_key += 1
        ok = self.bm.commit(b, k)
        assert ok == (k not in self.keys)
        if ok:
            self.keys[k] = b

    @precondition(lambda self: self.tables)
    @rule(index=st.integers(0, 100))
    def free(self, index: int) -> None:
        table = self.tables.pop(index % len(self.tables))
        self.bm.free(table)
        for b in reversed(table):
            self.refs[b] -= 1
            if self.refs[b] == 0 and b in self.keys.values():
                self.lru.append(b)

    @invariant()
    def matches_model(self) -> None:
        for b in range(NUM_BLOCKS):
            assert self.refs.get(b, 0) >= 0
            assert self.bm.ref_count(BlockId(b)) == self.refs.get(b, 0)
        used = sum(1 for r in self.refs.values() if r > 0)
        assert self.bm.num_free + used == NUM_BLOCKS
        assert self.bm.num_cached == len(self.keys)
        for k, b in self.keys.items():
            assert self.bm.lookup([k]) == [b]
            assert self.bm.key_of(BlockId(b)) == k


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_block_manager_machine = BlockManagerMachine.TestCase
