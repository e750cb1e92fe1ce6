"""What a disk tier finds when it opens: the blocks its index lists, fitted to its capacity.

Runs on the worker side, once, inside ``DiskStore.open`` (before any I/O thread uses
the store). The index records are hints: a block listed here is verified when it is
loaded, so a stale or torn record costs a miss, never wrong bytes.

Order of work: every size class's slots are counted; where a key is listed in two
slots the later record wins; while the blocks found take more than the capacity (it
was lowered since they were written) the least recently used are dropped; the records
of dropped and duplicate blocks are cleared; blocks in slots past what the capacity
allows are moved down into free slots, and the files are cut to the capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.media.disk_files import SegmentFiles
from kvtier.media.disk_layout import EMPTY_RECORD, Slot, StoredBlock, encode_record, scan
from kvtier.media.disk_slots import SlotTable


@dataclass(frozen=True, slots=True)
class Recovered:
    """The blocks kept at open.

    Attributes:
        last_use: each kept block's last use (ns since the epoch).
        blocks: the kept blocks, least recently used first.
    """

    last_use: dict[bytes, int]
    blocks: tuple[StoredBlock, ...]


def recover(files: SegmentFiles, table: SlotTable, capacity_bytes: int) -> Recovered:
    """Fill the empty ``table`` from the index files of ``files.directory``.

    Deletes files of slots no index reaches, clears the records of blocks not kept,
    and moves and cuts so that every size's slots fit ``capacity_bytes``.
    """
    found: list[tuple[int, bytes, Slot]] = []
    classes = scan(files.directory)
    for size_class in classes:
        table.grow(size_class.slot_bytes, size_class.slots)
        for path in size_class.unreachable:
            path.unlink(missing_ok=True)
        for g, (key, use) in size_class.records.items():
            found.append((use, key, Slot(size_class.slot_bytes, g)))
    found.sort()
    newest: dict[bytes, tuple[int, Slot]] = {}
    for use, key, slot in found:  # a key in two slots: the later record wins
        newest[key] = (use, slot)
    order = sorted((use, key, slot) for key, (use, slot) in newest.items())
    total = sum(slot.slot_bytes for _, _, slot in order)
    while order and total > capacity_bytes:  # the capacity was lowered
        total -= order.pop(0)[2].slot_bytes
    last_use: dict[bytes, int] = {}
    for use, key, slot in order:
        table.place(key, slot)
        last_use[key] = use
    kept = {slot for _, _, slot in order}
    for _, _, slot in found:  # records of dropped or duplicate blocks
        if slot not in kept:
            files.write_record(slot, EMPTY_RECORD)
    for size_class in classes:
        _fit(files, table, last_use, size_class.slot_bytes)
    blocks = tuple(
        StoredBlock(key, held.slot_bytes, use)
        for use, key, _ in order
        if (held := table.lookup(key)) is not None
    )
    return Recovered(last_use, blocks)


def _fit(
    files: SegmentFiles, table: SlotTable, last_use: dict[bytes, int], slot_bytes: int
) -> None:
    """Fit the slots of that size into the capacity: move blocks down, cut the files."""
    limit, have = table.limit(slot_bytes), table.slots(slot_bytes)
    if have <= limit:
        return
    for key, slot in table.held():
        if slot.slot_bytes != slot_bytes or slot.index < limit:
            continue
        target = table.lowest_free(slot_bytes)
        assert target is not None and target.index < limit, "the kept blocks fit"
        files.copy_slot(slot, target)
        files.write_record(target, encode_record(key, last_use[key]))
        table.move(key, target)
        files.write_record(slot, EMPTY_RECORD)
    files.cut(slot_bytes, have, limit)
    table.shrink(slot_bytes, limit)
