"""TieredManager under random interleavings, with simulated bytes.

A fake worker executes every job through the slots and keys in its specs: CPU slots
hold "bytes" (the key they were written for), the disk holds bytes per key. A spec
that pointed at the wrong slot would serve wrong bytes, and this machine would see
it. Jobs complete in any order, successfully or not.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.blocks import Medium
from kvtier.load_store_specs import BlockIdsSpec, KeyedBlocksSpec
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.tiering import TieredManager, TierJob

UNIVERSE = [f"k{i}".encode() for i in range(10)]
key_lists = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=4, unique=True)


class TieringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cpu_cap, self.disk_cap = 4, 6
        primary = CPUOffloadingManager(num_blocks=self.cpu_cap, block_size=4)
        disk = TierManager(
            medium=Medium.DISK,
            num_blocks=self.disk_cap,
            block_size=4,
            policy=make_policy("arc", self.disk_cap),
        )
        self.t = TieredManager(primary, [disk], max_pending_writes=4)
        self.cpu_bytes: dict[int, bytes] = {}  # slot -> the key whose bytes it holds
        self.disk_bytes: dict[bytes, bytes] = {}
        self.stores: list[tuple[bytes, ...]] = []
        self.writes: list[TierJob] = []
        self.promotions: list[TierJob] = []
        self.ever_ready_in_cpu: set[bytes] = set()

    @rule(ks=key_lists)
    def engine_store(self, ks: list[bytes]) -> None:
        out = self.t.prepare_store(ks)
        if out is None:
            return
        assert isinstance(out.store_spec, BlockIdsSpec)
        for key, slot in zip(out.block_hashes_to_store, out.store_spec.block_ids, strict=True):
            self.cpu_bytes[slot] = key  # the GPU->CPU copy
        if out.block_hashes_to_store:
            self.stores.append(out.block_hashes_to_store)

    @precondition(lambda self: self.stores)
    @rule(data=st.data(), ok=st.booleans())
    def finish_store(self, data: st.DataObject, ok: bool) -> None:
        batch = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1)))
        self.t.complete_store(batch, success=ok)
        if ok:
            self.ever_ready_in_cpu.update(batch)

    @rule(limit=st.integers(1, 3))
    def start_writes(self, limit: int) -> None:
        for job in self.t.prepare_writes(limit):
            assert isinstance(job.src, BlockIdsSpec) and isinstance(job.dst, KeyedBlocksSpec)
            assert job.dst.block_hashes == job.block_hashes
            for key, slot in zip(job.block_hashes, job.src.block_ids, strict=True):
                assert self.cpu_bytes[slot] == key, "write-through read the wrong CPU slot"
            self.writes.append(job)

    @precondition(lambda self: self.writes)
    @rule(data=st.data(), ok=st.booleans())
    def finish_write(self, data: st.DataObject, ok: bool) -> None:
        job = self.writes.pop(data.draw(st.integers(0, len(self.writes) - 1)))
        if ok:
            for key in job.block_hashes:
                self.disk_bytes[key] = key
        self.t.complete_write(job, success=ok)

    def on_disk_only(self) -> list[bytes]:
        disk = self.t.secondaries[0]
        return [
            k for k in UNIVERSE if disk.state(k) is BlockState.READY and k not in self.t.primary
        ]

    @rule(ks=key_lists)
    def promote_any(self, ks: list[bytes]) -> None:
        """Keys in no tier, or being stored, make the whole promotion refuse."""
        if not all(self.t.holder(k) for k in ks):
            assert self.t.prepare_promotion(ks) is None

    @precondition(lambda self: self.on_disk_only())
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        candidates = self.on_disk_only()
        ks = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
        jobs = self.t.prepare_promotion(ks)
        if jobs is None:
            return
        for job in jobs:
            assert isinstance(job.src, KeyedBlocksSpec) and isinstance(job.dst, BlockIdsSpec)
            for key in job.src.block_hashes:
                assert self.disk_bytes.get(key) == key, "promoted a block the disk lacks"
            self.promotions.append(job)

    @precondition(lambda self: self.promotions)
    @rule(data=st.data(), ok=st.booleans())
    def finish_promotion(self, data: st.DataObject, ok: bool) -> None:
        job = self.promotions.pop(data.draw(st.integers(0, len(self.promotions) - 1)))
        assert isinstance(job.dst, BlockIdsSpec)
        if ok:
            for key, slot in zip(job.block_hashes, job.dst.block_ids, strict=True):
                self.cpu_bytes[slot] = self.disk_bytes[key]
        self.t.complete_promotion(job, success=ok)
        if ok:
            self.ever_ready_in_cpu.update(job.block_hashes)
            for key, slot in zip(job.block_hashes, job.dst.block_ids, strict=True):
                assert self.t.primary.slot(key) == slot, "promoted into the wrong CPU slot"

    @rule(ks=key_lists)
    def load_to_gpu(self, ks: list[bytes]) -> None:
        n = self.t.primary.lookup(ks)
        if n == 0:
            return
        spec = self.t.prepare_load(ks[:n])
        assert isinstance(spec, BlockIdsSpec)
        for key, slot in zip(ks[:n], spec.block_ids, strict=True):
            assert self.cpu_bytes[slot] == key, "a load would serve wrong bytes"
        self.t.complete_load(ks[:n])

    @rule(ks=key_lists)
    def lookup(self, ks: list[bytes]) -> None:
        expect = 0
        for key in ks:
            if self.t.holder(key) is None:
                break
            expect += 1
        assert self.t.lookup(ks) == expect

    @invariant()
    def tiers_are_sound(self) -> None:
        primary, disk = self.t.primary, self.t.secondaries[0]
        assert len(primary) <= self.cpu_cap and len(disk) <= self.disk_cap
        for key in UNIVERSE:
            if disk.state(key) is BlockState.READY:
                assert key in self.ever_ready_in_cpu, "disk holds a block never ready in CPU"
                assert self.disk_bytes.get(key) == key
        in_flight_writes = {k for j in self.writes for k in j.block_hashes}
        for key in UNIVERSE:
            assert primary.pins(key) == (key in in_flight_writes)

    def teardown(self) -> None:
        for job in self.writes:
            self.t.complete_write(job, success=True)
        for job in self.promotions:
            self.t.complete_promotion(job, success=True)
        for key in UNIVERSE:
            assert self.t.primary.pins(key) == 0 and self.t.secondaries[0].pins(key) == 0


TestTiering = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)(TieringMachine).TestCase
