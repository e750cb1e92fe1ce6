"""``GhostList`` behaves as an ``OrderedDict`` of keys used as a FIFO (the model).

A state machine adds, removes, discards and drops the oldest keys from both and
compares the ghosts in order after every step; few keys, so a key returns and is
evicted again while its dead entry is still queued, and the deque gets rebuilt.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies import entries
from kvtier.scheduler.policies.ghosts import GhostList

KEYS = st.sampled_from([BlockHash(bytes([i])) for i in range(6)])


class GhostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ghosts = GhostList()
        self.model: OrderedDict[BlockHash, None] = OrderedDict()

    @rule(keys=st.lists(KEYS, unique=True))
    def update(self, keys: list[BlockHash]) -> None:
        keys = [k for k in keys if k not in self.model]  # never a ghost twice
        self.ghosts.update(iter(keys))
        self.model.update(dict.fromkeys(keys))

    @rule(key=KEYS)
    def remove(self, key: BlockHash) -> None:
        if key in self.model:
            self.ghosts.remove(key)
            del self.model[key]

    @rule(key=KEYS)
    def discard(self, key: BlockHash) -> None:
        self.ghosts.discard(key)
        self.model.pop(key, None)

    @rule(data=st.data())
    def pop_oldest(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(-1, len(self.model)))
        self.ghosts.pop_oldest(n)
        for _ in range(n):
            self.model.popitem(last=False)

    @invariant()
    def same_ghosts_in_order(self) -> None:
        assert list(self.ghosts) == list(self.model)
        assert len(self.ghosts) == len(self.model)
        for key in [BlockHash(bytes([i])) for i in range(6)]:
            assert (key in self.ghosts) == (key in self.model)
            assert self.ghosts.isdisjoint([key]) == (key not in self.model)

    @invariant()
    def dead_entries_are_counted_and_bounded(self) -> None:
        g = self.ghosts._queue
        dead = sum(g._dead.values())
        assert dead == g._n_dead
        assert len(list(g.entries())) == g._size == len(self.model) + dead
        assert 0 <= g._head < len(g._ring) and g._size <= len(g._ring)
        free = len(g._ring) - g._size  # the slots outside the queue hold no key
        assert sum(k is None for k in g._ring) == free
        self.most = max(getattr(self, "most", 0), len(self.model))
        assert dead <= self.most + entries.COMPACT_SLACK  # rebuilt past that


class SmallSlackGhostMachine(GhostMachine):
    """The same with a rebuild after two dead entries, so rebuilds happen often."""

    def __init__(self) -> None:
        super().__init__()
        self._slack = entries.COMPACT_SLACK
        entries.COMPACT_SLACK = 2

    def teardown(self) -> None:
        entries.COMPACT_SLACK = self._slack


class SmallRingGhostMachine(GhostMachine):
    """The same in a ring of two slots at first, so that it wraps and grows often."""

    def __init__(self) -> None:
        self._min_ring = entries.MIN_RING
        entries.MIN_RING = 2
        super().__init__()

    def teardown(self) -> None:
        entries.MIN_RING = self._min_ring


TestGhostList = GhostMachine.TestCase
TestGhostList.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestGhostListRebuilds = SmallSlackGhostMachine.TestCase
TestGhostListRebuilds.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestGhostListSmallRing = SmallRingGhostMachine.TestCase
TestGhostListSmallRing.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
