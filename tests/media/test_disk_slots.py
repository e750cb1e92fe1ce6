"""SlotTable against a plain model: slots never shared, runs when they exist, bytes bounded."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.media.disk_layout import Slot
from kvtier.media.disk_slots import SlotTable

SIZES = (4096, 12288)
CAPACITY = 20 * 4096


def has_run(free: set[int], n: int) -> bool:
    return any(all(s + i in free for i in range(n)) for s in free)


class SlotTableMachine(RuleBasedStateMachine):
    """Model: per size, the slots that exist; key -> slot; the reserved slots."""

    def __init__(self) -> None:
        super().__init__()
        self.table = SlotTable(CAPACITY)
        self.slots = dict.fromkeys(SIZES, 0)
        self.held: dict[bytes, Slot] = {}
        self.reserved: list[Slot] = []

    def free(self, size: int) -> set[int]:
        taken = {s.index for s in [*self.held.values(), *self.reserved] if s.slot_bytes == size}
        return set(range(self.slots[size])) - taken

    def budget(self) -> int:
        return sum(s.slot_bytes for s in [*self.held.values(), *self.reserved])

    @rule(size=st.sampled_from(SIZES), more=st.integers(1, 6))
    def grow(self, size: int, more: int) -> None:
        new = min(self.slots[size] + more, CAPACITY // size)
        self.table.grow(size, new)
        self.slots[size] = new

    @rule(size=st.sampled_from(SIZES), n=st.integers(1, 5))
    def reserve(self, size: int, n: int) -> None:
        free = self.free(size)
        got = self.table.reserve(size, n)
        possible = len(free) >= n and self.budget() + n * size <= CAPACITY
        if not possible:
            assert got is None
            return
        assert got is not None and len(got) == n
        picks = [s.index for s in got]
        assert all(s.slot_bytes == size for s in got) and set(picks) <= free
        assert len(set(picks)) == n
        if has_run(free, n):  # the lowest run of n
            start = min(s for s in free if all(s + i in free for i in range(n)))
            assert picks == list(range(start, start + n))
        else:  # the lowest free slots
            assert picks == sorted(free)[:n]
        self.reserved += got

    @precondition(lambda self: self.reserved)
    @rule(data=st.data(), k=st.integers(0, 9))
    def commit(self, data: st.DataObject, k: int) -> None:
        slot = self.reserved.pop(data.draw(st.integers(0, len(self.reserved) - 1)))
        key = bytes([k]) * 8
        old = self.table.commit(key, slot)
        assert old == self.held.get(key)
        self.held[key] = slot

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        slot = self.reserved.pop(data.draw(st.integers(0, len(self.reserved) - 1)))
        self.table.release(slot)

    @rule(k=st.integers(0, 9), wrong_slot=st.booleans())
    def remove(self, k: int, wrong_slot: bool) -> None:
        key = bytes([k]) * 8
        held = self.held.get(key)
        if wrong_slot and held is not None:  # a stale caller: nothing happens
            assert self.table.remove(key, Slot(held.slot_bytes, held.index + 1)) is None
            return
        assert self.table.remove(key) == self.held.pop(key, None)

    @invariant()
    def agrees(self) -> None:
        assert sorted(self.table.keys()) == sorted(self.held)
        for key, slot in self.held.items():
            assert self.table.lookup(key) == slot
        assert len({*self.held.values()}) == len(self.held), "a slot holds one block"
        assert self.table.used_bytes == sum(s.slot_bytes for s in self.held.values())
        assert self.table.reserved_bytes == sum(s.slot_bytes for s in self.reserved)
        assert self.table.used_bytes + self.table.reserved_bytes <= CAPACITY
        for size in SIZES:
            assert self.table.slots(size) == self.slots[size]
            assert self.table.free_slots(size) == len(self.free(size))


SlotTableMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestSlotTable = SlotTableMachine.TestCase
