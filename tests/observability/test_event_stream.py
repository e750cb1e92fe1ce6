"""The KV event stream, replayed, is the tiers' contents -- after every step.

A subscriber that only sees the events (``take_events``: blocks stored, blocks
removed, per tier) and applies them in order must hold exactly the blocks each tier
holds READY. The tiering runs under the random interleavings of
``test_tiering_stateful`` (stores, write-throughs, promotions, failures, loads), and
one more rule makes a step in which a block is evicted and stored again, so its
``removed`` and ``stored`` events come in one batch and only their order tells the
subscriber what is true.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from kvtier.blocks import BlockHash, Medium
from kvtier.load_store_specs import BlockIdsSpec
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.protocol import PrepareStoreOutput
from tests.scheduler.test_tiering_stateful import UNIVERSE, TieringMachine


class EventStreamMachine(TieringMachine):
    def __init__(self) -> None:
        super().__init__()
        for tier in (self.t.primary, *self.t.secondaries):
            tier.enable_events = True
        self.seen: dict[Medium, set[BlockHash]] = {Medium.CPU: set(), Medium.DISK: set()}

    @rule(victim=st.sampled_from(UNIVERSE), fresh=st.sampled_from(UNIVERSE))
    def evict_and_store_again_in_one_step(self, victim: bytes, fresh: bytes) -> None:
        """Fill the CPU tier so that storing ``fresh`` evicts, then store the evicted
        block again before anyone takes the events."""
        primary = self.t.primary
        if fresh in primary or victim == fresh:
            return
        out = self._store_now([fresh])
        for gone in out.block_hashes_evicted if out is not None else ():
            self._store_now([gone])

    def _store_now(self, keys: list[bytes]) -> PrepareStoreOutput | None:
        """A store whose copy is done at once (the parent's model of the bytes kept)."""
        out = self.t.prepare_store(keys)
        if out is None or not out.block_hashes_to_store:
            return out
        assert isinstance(out.store_spec, BlockIdsSpec)
        for key, slot in zip(out.block_hashes_to_store, out.store_spec.block_ids, strict=True):
            self.cpu_bytes[slot] = key
        self.t.complete_store(out.block_hashes_to_store)
        self.ever_ready_in_cpu.update(out.block_hashes_to_store)
        return out

    @invariant()
    def the_replayed_events_are_every_tiers_ready_blocks(self) -> None:
        for event in self.t.take_events():
            blocks = self.seen[event.medium]
            if event.removed:
                blocks.difference_update(event.block_hashes)
            else:
                blocks.update(event.block_hashes)
        for tier in (self.t.primary, *self.t.secondaries):
            resident = tier.keys()
            ready = {k for k in resident if tier.state(k) is BlockState.READY}
            assert self.seen[tier.medium] == ready, tier.medium


TestEventStream = EventStreamMachine.TestCase
TestEventStream.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
