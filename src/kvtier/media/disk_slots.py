"""``SlotTable``: which slot holds which block, which slots are free, and the byte budget.

Runs on the worker side, inside ``DiskStore`` (which holds its lock around every call;
the table itself does no I/O and no locking). Each slot size has its own slots,
numbered from 0 (``disk_layout``); a slot is in exactly one state::

    free --reserve--> reserved --commit(key)--> holds key --remove--> free
                         \\--release--> free

Reservations ask for ``n`` slots at once and get consecutive ones where a free run of
``n`` exists (the lowest such run), else the lowest free slots: blocks stored together
then sit next to each other and load with one read. Bytes of held and reserved slots
never exceed ``capacity_bytes``.
"""

from __future__ import annotations

from kvtier.media.disk_layout import Slot

_FREE = 1


class SlotTable:
    """Slots of every size, the key each holds, and the bytes they take.

    Args:
        capacity_bytes: the most bytes held and reserved slots may take together.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._free: dict[int, bytearray] = {}  # slot bytes -> one byte per slot, 1 = free
        self._where: dict[bytes, Slot] = {}
        self.used_bytes = 0
        self.reserved_bytes = 0

    # -- queries -----------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def keys(self) -> list[bytes]:
        """Keys held now (a snapshot)."""
        return list(self._where)

    def held(self) -> list[tuple[bytes, Slot]]:
        """``(key, slot)`` of every block held now (a snapshot)."""
        return list(self._where.items())

    def lookup(self, key: bytes) -> Slot | None:
        """The slot holding ``key``, or ``None``."""
        return self._where.get(key)

    def slots(self, slot_bytes: int) -> int:
        """Slots of that size that exist (free, reserved or held)."""
        return len(self._free.get(slot_bytes, b""))

    def limit(self, slot_bytes: int) -> int:
        """The most slots of that size the capacity allows."""
        return self.capacity_bytes // slot_bytes

    def free_slots(self, slot_bytes: int) -> int:
        """Free slots of that size."""
        return self._free.get(slot_bytes, bytearray()).count(_FREE)

    def fits(self, slot_bytes: int, n: int) -> bool:
        """Whether ``n`` more slots of that size fit the byte budget."""
        return self.used_bytes + self.reserved_bytes + n * slot_bytes <= self.capacity_bytes

    def has_run(self, slot_bytes: int, n: int) -> bool:
        """Whether ``n`` consecutive free slots of that size exist."""
        return self._free.get(slot_bytes, bytearray()).find(bytes([_FREE]) * n) >= 0

    # -- transitions ---------------------------------------------------------------------

    def grow(self, slot_bytes: int, slots: int) -> None:
        """Slots of that size now number ``slots``; the new ones are free."""
        free = self._free.setdefault(slot_bytes, bytearray())
        assert slots >= len(free), "slots are never taken away while open"
        free.extend(bytes([_FREE]) * (slots - len(free)))

    def shrink(self, slot_bytes: int, slots: int) -> None:
        """Slots of that size now number ``slots``; those removed must be free."""
        free = self._free[slot_bytes]
        assert all(free[slots:]), "only free slots are taken away"
        del free[slots:]

    def lowest_free(self, slot_bytes: int) -> Slot | None:
        """The free slot of that size with the lowest number, or ``None``."""
        pos = self._free.get(slot_bytes, bytearray()).find(_FREE)
        return None if pos < 0 else Slot(slot_bytes, pos)

    def move(self, key: bytes, to: Slot) -> Slot:
        """``key`` (held) now lives in ``to`` (free, same size); returns its old, freed slot."""
        old = self._where[key]
        free = self._free[to.slot_bytes]
        assert old.slot_bytes == to.slot_bytes and free[to.index] == _FREE
        free[to.index], free[old.index] = 0, _FREE
        self._where[key] = to
        return old

    def place(self, key: bytes, slot: Slot) -> None:
        """At open: ``slot`` (free, existing) holds ``key`` (not yet held)."""
        free = self._free[slot.slot_bytes]
        assert free[slot.index] == _FREE and key not in self._where
        free[slot.index] = 0
        self._hold(key, slot)

    def reserve(self, slot_bytes: int, n: int) -> list[Slot] | None:
        """``n`` free slots of that size, consecutive where possible; ``None`` if not possible.

        ``None`` when the byte budget or the free slots do not suffice; nothing changes then.
        """
        free = self._free.get(slot_bytes)
        if n <= 0 or free is None or not self.fits(slot_bytes, n):
            return None
        start = free.find(bytes([_FREE]) * n)
        if start >= 0:
            picks = list(range(start, start + n))
        else:
            picks, pos = [], 0
            while len(picks) < n:
                pos = free.find(_FREE, pos)
                if pos < 0:
                    return None
                picks.append(pos)
                pos += 1
        for i in picks:
            free[i] = 0
        self.reserved_bytes += n * slot_bytes
        return [Slot(slot_bytes, i) for i in picks]

    def recount(self) -> int:
        """Free every reserved slot and count the held ones again; how many were freed.

        For a forked child (``DiskStore._after_fork``): the writes that reserved slots
        are the parent's, and a parent thread may have stopped half-way through
        changing the table at the fork.
        """
        held = {(slot.slot_bytes, slot.index) for slot in self._where.values()}
        freed = 0
        for slot_bytes, free in self._free.items():
            for i, mark in enumerate(free):
                if mark != _FREE and (slot_bytes, i) not in held:
                    free[i] = _FREE
                    freed += 1
        self.reserved_bytes = 0
        self.used_bytes = sum(slot.slot_bytes for slot in self._where.values())
        return freed

    def release(self, slot: Slot) -> None:
        """A reserved slot whose write failed: free again."""
        self.reserved_bytes -= slot.slot_bytes
        self._free[slot.slot_bytes][slot.index] = _FREE

    def commit(self, key: bytes, slot: Slot) -> Slot | None:
        """A reserved slot now holds ``key``; the slot ``key`` held before (freed), if any."""
        self.reserved_bytes -= slot.slot_bytes
        old = self.remove(key)
        self._hold(key, slot)
        return old

    def remove(self, key: bytes, slot: Slot | None = None) -> Slot | None:
        """Forget ``key`` (only if it is at ``slot``, when given); its freed slot, or ``None``."""
        held = self._where.get(key)
        if held is None or (slot is not None and held != slot):
            return None
        del self._where[key]
        self.used_bytes -= held.slot_bytes
        self._free[held.slot_bytes][held.index] = _FREE
        return held

    def _hold(self, key: bytes, slot: Slot) -> None:
        self._where[key] = slot
        self.used_bytes += slot.slot_bytes
