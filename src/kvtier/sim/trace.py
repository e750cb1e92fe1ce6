"""Workload traces: Mooncake-format JSON lines, parsed and checked.

Runs anywhere (pure Python). A Mooncake trace has one JSON object per line::

    {"timestamp": 40, "input_length": 23769, "output_length": 3, "hash_ids": [151, 152, ...]}

``hash_ids`` are prefix-chained block ids, one per ``block_size``-token block of the
input (``len(hash_ids) == ceil(input_length / block_size)``); each id stands for its
block *and everything before it*, so equal ids mean equal prefixes. kvtier's manager
takes opaque ``bytes`` keys, so each id is mapped to a stable 8-byte little-endian key
(:func:`trace_block_key`). Equal ids share one ``bytes`` object, which keeps dictionary
lookups in the replay cheap.

Every malformed line raises :class:`~kvtier.errors.TraceError` naming the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.blocks import BlockHash
from kvtier.errors import TraceError

DEFAULT_BLOCK_SIZE = 512
"""Tokens per block in Mooncake's published traces."""

_MAX_ID = 2**64 - 1


def trace_block_key(hash_id: int) -> BlockHash:
    """The manager key of a trace block id: 8 bytes, little-endian."""
    return BlockHash(hash_id.to_bytes(8, "little"))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        timestamp_ms: arrival time in milliseconds from the start of the trace.
        input_length: prompt tokens.
        output_length: generated tokens.
        hash_ids: prefix-chained block ids of the prompt, in order.
        keys: the same blocks as manager keys (:func:`trace_block_key`), in order.
    """

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    keys: tuple[BlockHash, ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace: requests in file order and the block size they were cut with.

    Attributes:
        requests: the requests, in the order of the file.
        block_size: tokens per block.
        source: where the trace came from (a path, or a generator's description).
        num_block_refs: total block references (sum of ``len(hash_ids)``).
        num_distinct_blocks: distinct block ids; capacities given as fractions
            (``5%``) are fractions of this.
    """

    requests: tuple[TraceRequest, ...]
    block_size: int
    source: str
    num_block_refs: int
    num_distinct_blocks: int


def _int_field(obj: dict[str, object], name: str, line: int) -> int:
    if name not in obj:
        raise TraceError(f"missing field {name!r}", line)
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"field {name!r} must be a non-negative integer, got {value!r}", line)
    return value


def _parse_line(
    text: str, line: int, block_size: int, interned: dict[int, BlockHash]
) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON ({exc.msg} at column {exc.colno})", line) from None
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", line)
    timestamp = obj.get("timestamp")
    if timestamp is None:
        raise TraceError("missing field 'timestamp'", line)
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or timestamp < 0:
        raise TraceError(
            f"field 'timestamp' must be a non-negative number, got {timestamp!r}", line
        )
    input_length = _int_field(obj, "input_length", line)
    output_length = _int_field(obj, "output_length", line)
    if "hash_ids" not in obj:
        raise TraceError("missing field 'hash_ids'", line)
    raw_ids = obj["hash_ids"]
    if not isinstance(raw_ids, list):
        raise TraceError(f"field 'hash_ids' must be a list, got {type(raw_ids).__name__}", line)
    keys: list[BlockHash] = []
    for position, hid in enumerate(raw_ids):
        key = interned.get(hid) if type(hid) is int else None
        if key is None:
            if type(hid) is not int or not 0 <= hid <= _MAX_ID:
                raise TraceError(
                    f"hash_ids[{position}] must be an integer in [0, 2**64), got {hid!r}", line
                )
            key = interned[hid] = trace_block_key(hid)
        keys.append(key)
    expected = math.ceil(input_length / block_size)
    if len(raw_ids) != expected:
        raise TraceError(
            f"{len(raw_ids)} hash_ids for input_length {input_length}, but blocks of "
            f"{block_size} tokens need {expected}; is the block size right?",
            line,
        )
    return TraceRequest(
        timestamp_ms=float(timestamp),
        input_length=input_length,
        output_length=output_length,
        hash_ids=tuple(raw_ids),
        keys=tuple(keys),
    )


def parse_mooncake(
    lines: Iterable[str], *, block_size: int = DEFAULT_BLOCK_SIZE, source: str = "<lines>"
) -> Trace:
    """Parse Mooncake-format JSON lines. Blank lines are skipped.

    Args:
        lines: the lines of the trace (with or without trailing newlines).
        block_size: tokens per block the ``hash_ids`` were cut with.
        source: a name for the trace, kept in the result and in reports.

    Raises:
        TraceError: a line is malformed; ``line`` is its 1-based number.
        ValueError: ``block_size`` is not positive.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    interned: dict[int, BlockHash] = {}
    requests: list[TraceRequest] = []
    refs = 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        request = _parse_line(text, number, block_size, interned)
        refs += len(request.hash_ids)
        requests.append(request)
    return Trace(
        requests=tuple(requests),
        block_size=block_size,
        source=source,
        num_block_refs=refs,
        num_distinct_blocks=len(interned),
    )


def read_mooncake(path: str | Path, *, block_size: int = DEFAULT_BLOCK_SIZE) -> Trace:
    """Read a Mooncake-format JSON-lines trace file.

    Raises:
        TraceError: the file cannot be read, or a line is malformed (named).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_mooncake(handle, block_size=block_size, source=str(path))
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace {str(path)!r} is not UTF-8 text: {exc.reason}") from None


def _json_number(value: float) -> float | int:
    return int(value) if value.is_integer() else value


def write_mooncake(trace: Trace, path: str | Path) -> None:
    """Write a trace as Mooncake-format JSON lines (what :func:`read_mooncake` reads)."""
    with open(path, "w", encoding="utf-8") as handle:
        for request in trace.requests:
            record = {
                "timestamp": _json_number(request.timestamp_ms),
                "input_length": request.input_length,
                "output_length": request.output_length,
                "hash_ids": list(request.hash_ids),
            }
            handle.write(json.dumps(record) + "\n")


def trace_from_requests(
    requests: Iterable[tuple[float, int, int, Iterable[int]]],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    source: str = "<generated>",
) -> Trace:
    """Build a trace from ``(timestamp_ms, input_length, output_length, hash_ids)``.

    The same checks as a file (a bad request raises ``TraceError`` naming its index,
    1-based, as the line).
    """
    lines = (
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": list(ids)})
        for t, i, o, ids in requests
    )
    return parse_mooncake(lines, block_size=block_size, source=source)
