"""Failure reasons, the tier a job belongs to, URLs without credentials, log once."""

from __future__ import annotations

import logging

import pytest

from kvtier.blocks import Medium
from kvtier.observability.failures import (
    REASONS,
    FailureKey,
    FailureLog,
    classify,
    job_tier,
    redact_url,
)

# Error texts as the handlers and stores write them (see media/disk.py, media/remote.py,
# worker/pooled.py, worker/cpu_remote.py).
ERRORS = [
    ("1 task(s) failed: block 00ff: disk write of block 00ff failed: "
     "[Errno 28] No space left on device", "full"),
    ("disk tier full: block 00ff needs 8192 bytes, 0 free", "full"),
    ("disk write of block 00ff failed: [Errno 30] Read-only file system: '/x'", "unwritable"),
    ("disk write of block 00ff failed: [Errno 13] Permission denied: '/x'", "unwritable"),
    ("remote store: remote store failed: ConnectionError('Error 111 connecting to "
     "127.0.0.1:1. Connection refused.')", "unreachable"),
    ("remote store unhealthy after 1 failure(s) (network:ConnectionError); next try in 0.4 s",
     "unreachable"),
    ("remote store failed: TimeoutError('Timeout reading from socket')", "unreachable"),
    ("2 of 2 values refused: OOM command not allowed when used memory > 'maxmemory'",
     "refused"),
    ("3 of 4 block(s) not loaded: 3 missed (evicted, expired or never stored); first 00",
     "miss"),
    ("block 00ff is not on disk", "miss"),
    ("block 00ff: checksum mismatch", "corrupt"),
    ("1 of 1 block(s) not loaded: 1 failed verification (deleted); first 00", "corrupt"),
    ("handler is shut down", "shut_down"),
    ("no handler for CPU->DISK (registered: GPU->CPU)", "invalid"),
    ("invalid transfer spec: takes (CPULoadStoreSpec, DiskLoadStoreSpec)", "invalid"),
    ("handler raised: RuntimeError('boom')", "error"),
    (None, "error"),
]  # fmt: skip


@pytest.mark.parametrize(("error", "reason"), ERRORS)
def test_each_error_text_gets_its_reason(error: str | None, reason: str) -> None:
    assert classify(error) == reason
    assert reason in REASONS


@pytest.mark.parametrize(
    ("src", "dst", "tier", "op"),
    [
        (Medium.CPU, Medium.GPU, Medium.CPU, "load"),
        (Medium.GPU, Medium.CPU, Medium.CPU, "store"),
        (Medium.CPU, Medium.DISK, Medium.DISK, "store"),
        (Medium.DISK, Medium.CPU, Medium.DISK, "load"),
        (Medium.CPU, Medium.REMOTE, Medium.REMOTE, "store"),
        (Medium.REMOTE, Medium.CPU, Medium.REMOTE, "load"),
    ],
)
def test_a_job_belongs_to_the_tier_farther_from_the_gpu(
    src: Medium, dst: Medium, tier: Medium, op: str
) -> None:
    assert job_tier(src, dst) == (tier, op)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://alice:s3cret@cache:6379/2", "redis://cache:6379/2"),
        ("rediss://:s3cret@cache.example:6380", "rediss://cache.example:6380"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_each_tier_and_reason_is_logged_once_and_every_block_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = FailureLog({Medium.REMOTE: "redis://bob:pw@cache:6379/0", Medium.DISK: "/kv"})
    refused = "remote store failed: ConnectionError('Error 111 connecting to cache:6379.')"
    with caplog.at_level(logging.WARNING, logger="kvtier.observability.failures"):
        log.record(Medium.REMOTE, "store", refused, 3)
        log.record(Medium.REMOTE, "store", "remote store unhealthy after 1 failure(s)", 5)
        log.record(Medium.REMOTE, "load", refused, 2)  # same tier, same reason: counted only
        log.record(Medium.DISK, "store", "[Errno 28] No space left on device", 4)
        log.record(Medium.DISK, "store", "[Errno 30] Read-only file system", 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("REMOTE tier at redis://cache:6379/0: unreachable: store of 3")
    assert lines[1].startswith("DISK tier at /kv: full: store of 4 block(s) failed")
    assert lines[2].startswith("DISK tier at /kv: unwritable: store of 1 block(s) failed")
    assert all("pw" not in line and "bob" not in line for line in lines)
    assert log.take() == {
        FailureKey(Medium.REMOTE, "store", "unreachable"): 8,
        FailureKey(Medium.REMOTE, "load", "unreachable"): 2,
        FailureKey(Medium.DISK, "store", "full"): 4,
        FailureKey(Medium.DISK, "store", "unwritable"): 1,
    }
    assert log.take() == {}
    assert str(FailureKey(Medium.DISK, "store", "full")) == "DISK store full"
