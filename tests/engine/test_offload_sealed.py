"""The reference engine with sealed disk and remote tiers (``encryption_key_file``), on
real files and a real redis-server.

No KV byte is at rest in the clear; the same key hits exactly as many blocks as the
plaintext tiers do; and a block that is not this key's -- sealed with another key, read
by an engine without a key, a plaintext block read by an engine with one, values
swapped between block keys -- is a miss: no hit, the same tokens as an engine without
offloading, every such block counted ``undecryptable`` for its tier in the stats and
the metrics, and one warning per tier.

Each engine serves one prompt, the longest conversation's last turn, once: the first
engine stores its blocks, a fresh second engine over the same directory or server looks
them up. One call, so the second engine's own recomputed blocks are never what it hits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtier.blocks import Medium
from kvtier.engine import LLM
from kvtier.engine.stats import EngineStats
from kvtier.media.block_format import header_size
from kvtier.media.disk_layout import LAYOUT, listed_blocks
from kvtier.observability.failures import FailureKey
from tests.certificates import make_certificates
from tests.redis_server import RedisServer, require_redis

from .workload import GPU_BLOCKS, PAGE, chats

PROMPT = chats()[-1]
STORED = len(PROMPT) // PAGE
"""Blocks the prompt fills: a second engine looks each one up
(``test_the_same_key_hits_as_many_blocks_as_plaintext_does`` checks the figure)."""
WRITTEN = (len(PROMPT) + 4 - 1) // PAGE
"""Blocks the first engine writes: the prompt's and its first three generated tokens'
(the last token's KV is never computed)."""
PLAIN_HEADER = header_size(32, 32)  # a plaintext value's header (32-byte key and fingerprint)
LOGGER = "kvtier.observability.failures"
ALICE = "alice-pw-5e9d"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis()
    server = RedisServer(tmp_path / "redis", ["--maxmemory", "64mb"]).start()
    yield server
    server.stop()


@pytest.fixture
def key_files(tmp_path: Path) -> dict[str, str]:
    """Two key files as the docs make them: raw bytes, and 64 hex digits."""
    raw, text = tmp_path / "a.key", tmp_path / "b.key"
    raw.write_bytes(bytes(range(32)))
    text.write_text(bytes(range(50, 82)).hex() + "\n")
    for path in (raw, text):
        path.chmod(0o600)
    return {"a": str(raw), "b": str(text)}


def tier_cfg(tier: Medium, where: Path | str, key_file: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"cpu_bytes_to_use": 64 * 2048, "block_size": PAGE}
    if tier is Medium.DISK:
        cfg |= {"disk_path": str(where), "disk_bytes_to_use": "16MiB"}
    else:
        cfg |= {"remote_url": str(where), "remote_timeout_s": 2.0}
    if key_file is not None:
        cfg["encryption_key_file"] = key_file
    return cfg


def serve_once(model: Any, cfg: dict[str, Any]) -> tuple[list[int], EngineStats, LLM]:
    """One fresh engine serves ``PROMPT``; it is returned closed (write-through flushed)."""
    llm = LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE, offload=cfg)
    (out,) = llm.generate([PROMPT], max_new_tokens=4)
    stats = llm.last_stats
    llm.close()
    assert stats is not None
    return out, stats, llm


def where(tier: Medium, tmp_path: Path, server: RedisServer) -> Path | str:
    return tmp_path / "disk" if tier is Medium.DISK else server.url


def values(server: RedisServer) -> dict[bytes, bytes]:
    with server.client() as client:
        return {name: client.get(name) for name in client.keys("kvtier:*")}


def rotate_values(server: RedisServer) -> int:
    """Each stored value moves to the next block key's name (every value stays a
    well-formed block of this key and model)."""
    held = values(server)
    names = sorted(held)
    with server.client() as client:
        for name, other in zip(names, names[1:] + names[:1], strict=True):
            client.set(name, held[other])
    return len(names)


def rotate_slots(disk: Path) -> int:
    """Each block's slot takes the next block's bytes, header and payload (a closed
    store's files, edited as anyone who can write the directory could)."""
    (fp_dir,) = (disk / LAYOUT).iterdir()
    blocks = listed_blocks(fp_dir)
    raw = []
    for b in blocks:
        with open(b.segment, "rb") as f:
            f.seek(b.offset)
            raw.append(f.read(b.slot_bytes))
    for b, data in zip(blocks, raw[1:] + raw[:1], strict=True):
        with open(b.segment, "r+b") as f:
            f.seek(b.offset)
            f.write(data)
    return len(blocks)


@pytest.mark.parametrize("tier", [Medium.DISK, Medium.REMOTE], ids=["disk", "remote"])
def test_the_same_key_hits_as_many_blocks_as_plaintext_does(
    tiny_model: Any,
    baseline: list[list[int]],
    tmp_path: Path,
    redis_server: RedisServer,
    key_files: dict[str, str],
    tier: Medium,
) -> None:
    plain_at = tmp_path / "plain" if tier is Medium.DISK else redis_server.url
    serve_once(tiny_model, tier_cfg(tier, plain_at, None))
    plain_out, plain, _ = serve_once(tiny_model, tier_cfg(tier, plain_at, None))
    if tier is Medium.REMOTE:
        with redis_server.client() as client:
            client.flushdb()
    sealed_at = where(tier, tmp_path, redis_server)
    serve_once(tiny_model, tier_cfg(tier, sealed_at, key_files["a"]))
    out, sealed, _ = serve_once(tiny_model, tier_cfg(tier, sealed_at, key_files["a"]))
    assert plain_out == out == baseline[-1]
    assert plain.offload.hit_blocks == sealed.offload.hit_blocks == {tier: STORED}
    assert sealed.offload.failed_loads == 0 and dict(sealed.offload.failures) == {}


CASES = {
    "another key": ("a", "b"),
    "no key": ("a", None),
    "plaintext to a keyed engine": (None, "a"),
    "values swapped between keys": ("a", "a"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tier", [Medium.DISK, Medium.REMOTE], ids=["disk", "remote"])
def test_a_block_that_is_not_this_keys_is_a_miss_counted_undecryptable(
    tiny_model: Any,
    baseline: list[list[int]],
    tmp_path: Path,
    redis_server: RedisServer,
    key_files: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    tier: Medium,
    case: str,
) -> None:
    writer, reader = (None if k is None else key_files[k] for k in CASES[case])
    at = where(tier, tmp_path, redis_server)
    serve_once(tiny_model, tier_cfg(tier, at, writer))
    if case == "values swapped between keys":
        moved = (
            rotate_slots(tmp_path / "disk") if tier is Medium.DISK else rotate_values(redis_server)
        )
        assert moved == WRITTEN
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out, stats, llm = serve_once(tiny_model, tier_cfg(tier, at, reader))
    assert out == baseline[-1]
    assert stats.offload.hit_blocks.get(tier, 0) == 0
    assert stats.offload.failed_loads == STORED
    assert dict(stats.offload.failures) == {FailureKey(tier, "load", "undecryptable"): STORED}
    assert llm.metrics is not None
    sample = llm.metrics.registry.get_sample_value(
        "kvtier_failed_blocks_total", {"tier": tier.name, "op": "load", "reason": "undecryptable"}
    )
    assert sample == STORED
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f"{tier} tier" in line and "undecryptable" in line


def windows(value: bytes) -> list[bytes]:
    """Three 64-byte stretches of a plaintext value's payload (KV bytes)."""
    payload = value[PLAIN_HEADER:]
    return [payload[at : at + 64] for at in (0, len(payload) // 2, len(payload) - 64)]


def file_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_no_kv_bytes_in_the_clear_in_redis_or_the_disk_files(
    tiny_model: Any,
    baseline: list[list[int]],
    tmp_path: Path,
    redis_server: RedisServer,
    key_files: dict[str, str],
) -> None:
    """The same prompt's blocks, stored once in the clear and once sealed (the KV
    bytes are the same: the engine is deterministic): each window of the clear
    values is found in the clear disk files, none in the sealed values or files."""
    both = {"remote_url": redis_server.url, "remote_timeout_s": 2.0}
    plain_cfg = {**tier_cfg(Medium.DISK, tmp_path / "plain", None), **both}
    assert serve_once(tiny_model, plain_cfg)[0] == baseline[-1]
    clear = values(redis_server)
    assert len(clear) == WRITTEN
    grep = [w for v in clear.values() for w in windows(v)]
    assert len({*grep}) == 3 * WRITTEN  # distinct: none is padding
    plain_files = file_bytes(tmp_path / "plain")
    assert all(w in plain_files for w in grep)  # the grep finds KV in the clear
    with redis_server.client() as client:
        client.flushdb()
    sealed_cfg = {**tier_cfg(Medium.DISK, tmp_path / "sealed", key_files["a"]), **both}
    assert serve_once(tiny_model, sealed_cfg)[0] == baseline[-1]
    sealed = values(redis_server)
    assert sorted(sealed) == sorted(clear)  # the same block keys, sealed
    held = b"".join(sealed.values()) + file_bytes(tmp_path / "sealed")
    assert [w for w in grep if w in held] == []


def test_over_tls_with_an_acl_user_the_same_key_hits_and_another_misses(
    tiny_model: Any, baseline: list[list[int]], tmp_path: Path, key_files: dict[str, str]
) -> None:
    require_redis()
    certs = make_certificates(tmp_path / "certs")
    acl = tmp_path / "users.acl"
    acl.write_text(f"user default off\nuser alice on >{ALICE} ~kvtier:* +@all\n")
    server = RedisServer(
        tmp_path / "tls", ["--aclfile", str(acl)], username="alice", password=ALICE, tls=certs
    ).start()
    try:
        url = f"rediss://alice:{ALICE}@127.0.0.1:{server.port}/0"
        files = {
            "remote_tls_ca_file": str(certs.ca),
            "remote_tls_cert_file": str(certs.client_cert),
            "remote_tls_key_file": str(certs.client_key),
        }

        def cfg(key: str) -> dict[str, Any]:
            return {**tier_cfg(Medium.REMOTE, url, key_files[key]), **files}

        serve_once(tiny_model, cfg("a"))
        assert len(values(server)) == WRITTEN
        out, same, _ = serve_once(tiny_model, cfg("a"))
        assert out == baseline[-1] and same.offload.hit_blocks == {Medium.REMOTE: STORED}
        out, other, _ = serve_once(tiny_model, cfg("b"))
        assert out == baseline[-1] and other.offload.hit_blocks.get(Medium.REMOTE, 0) == 0
        undecryptable = FailureKey(Medium.REMOTE, "load", "undecryptable")
        assert dict(other.offload.failures) == {undecryptable: STORED}
    finally:
        server.stop()
