"""Parsing Mooncake traces: good lines load, every malformed line is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.errors import TraceError
from kvtier.sim.trace import parse_mooncake, read_mooncake, trace_block_key, write_mooncake

HEAD = '{"timestamp": 0, "input_length": 1, "output_length": 1, '
GOOD = json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]})


def test_parses_and_interns_keys() -> None:
    other = json.dumps({"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [7]})
    trace = parse_mooncake([GOOD, "", other])
    assert [r.hash_ids for r in trace.requests] == [(7, 8), (7,)]
    assert trace.requests[0].keys == (trace_block_key(7), trace_block_key(8))
    assert trace.requests[0].keys[0] is trace.requests[1].keys[0]
    assert (trace.num_block_refs, trace.num_distinct_blocks) == (3, 2)
    assert trace_block_key(1) == b"\x01" + bytes(7)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"input_length": 1, "output_length": 1, "hash_ids": [1]}', "missing field 'timestamp'"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "'input_length'"),
        ('{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}', "non-neg"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "missing field 'hash_ids'"),
        (HEAD + '"hash_ids": 3}', "a list"),
        (HEAD + '"hash_ids": ["a"]}', "[0]"),
        (HEAD + '"hash_ids": [-1]}', "[0]"),
        (HEAD + '"hash_ids": [18446744073709551616]}', "[0]"),
        (
            '{"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
            "timestamp",
        ),
        (
            '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, 2]}',
            "block size",
        ),
    ],
)
def test_malformed_line_is_named(line: str, message: str) -> None:
    with pytest.raises(TraceError, match=r"^line 3: ") as info:
        parse_mooncake([GOOD, GOOD, line, GOOD])
    assert info.value.line == 3
    assert message in str(info.value)


def test_block_size_is_checked_against_lengths() -> None:
    with pytest.raises(TraceError, match="is the block size right"):
        parse_mooncake([GOOD], block_size=256)
    assert parse_mooncake([GOOD], block_size=500).num_block_refs == 2


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_mooncake(tmp_path / "absent.jsonl")


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    trace = parse_mooncake([GOOD, GOOD])
    path = tmp_path / "t.jsonl"
    write_mooncake(trace, path)
    again = read_mooncake(path)
    assert again.requests == trace.requests
    assert path.read_text().splitlines()[0] == GOOD


def test_shipped_trace_is_the_published_one_byte_for_byte() -> None:
    """The in-package copy of Mooncake's trace matches the checksum its provenance records."""
    import hashlib

    from kvtier.sim.traces import SYNTHETIC_TRACE, SYNTHETIC_TRACE_SHA256

    assert hashlib.sha256(SYNTHETIC_TRACE.read_bytes()).hexdigest() == SYNTHETIC_TRACE_SHA256
    sources = (SYNTHETIC_TRACE.parent / "SOURCES.md").read_text()
    assert SYNTHETIC_TRACE_SHA256 in sources
