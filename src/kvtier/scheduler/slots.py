"""``FreeSlots``: a tier's free slot ids, in memory proportional to what the tier holds.

Runs in the scheduler; pure Python. A tier of ``capacity`` slots starts with every
slot free, but listing them all up front costs memory proportional to the capacity --
a 100 TiB disk tier would need gigabytes before it held a block. Here the slots never
handed out are one counter, and only slots given back are listed::

    free = [capacity-1, ..., next]  +  returned
           (never used: a counter)      (a list; ``pop`` takes from its end first)

It hands out exactly the slots a plain list ``[capacity-1, ..., 1, 0]`` would, used
as a stack (``pop``/``append`` at the end, ``take(n)`` = the last ``n``), so callers
see the same slot ids as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.blocks import BlockId


class FreeSlots:
    """The free slots of a tier of ``capacity`` slots, all free at first."""

    __slots__ = ("_capacity", "_next", "_returned")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._next = 0  # slots >= _next were never handed out
        self._returned: list[BlockId] = []

    def __len__(self) -> int:
        return len(self._returned) + self._capacity - self._next

    def append(self, slot: BlockId) -> None:
        """Give one slot back."""
        self._returned.append(slot)

    def extend(self, slots: Iterable[BlockId]) -> None:
        """Give slots back."""
        self._returned.extend(slots)

    def pop(self) -> BlockId:
        """Take one slot (the last returned, else the lowest never used).

        Raises:
            IndexError: no slot is free.
        """
        return self.take(1)[0]

    def take(self, n: int) -> list[BlockId]:
        """Take ``n`` slots, as ``stack[-n:]`` of the equivalent list would.

        Raises:
            IndexError: fewer than ``n`` slots are free (nothing is taken).
        """
        returned = self._returned
        if n <= len(returned):  # the usual case once the tier is full
            out = returned[len(returned) - n :]
            del returned[len(returned) - n :]
            return out
        if n > len(self):
            raise IndexError(f"take {n} slots from {len(self)} free")
        fresh = n - len(returned)
        out = [BlockId(i) for i in range(self._next + fresh - 1, self._next - 1, -1)]
        out += returned
        returned.clear()
        self._next += fresh
        return out
