"""``kvtier soak``: a short run with every fault kind, and the checks it relies on.

The runs are short (three seeds of a 4 s serving loop; starting three processes and
restarting one take longer on a shared machine), so their figures are checked for
what must hold in any run: every kind of fault injected over the three, no wrong
token, no crash, no corrupt block, every request compared in full.
"""

from __future__ import annotations

import errno
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from kvtier.cli import main
from kvtier.media.disk import DiskStore
from kvtier.soak.disk import DiskArea
from kvtier.soak.faults import FAULT_KINDS
from kvtier.soak.runner import Soak, SoakOptions
from kvtier.soak.workload import Turn
from tests.redis_server import require_redis


def test_three_short_soaks_inject_every_fault_and_serve_every_token_right(tmp_path: Path) -> None:
    require_redis()
    out = tmp_path / "soak.json"
    argv = ["soak", "--seeds", "3", "--seed", "3", "--duration", "4", "--fault-interval", "0.4"]
    assert main([*argv, "--json", str(out), "--workdir", str(tmp_path)]) == 0
    figures = json.loads(out.read_text())["results"]
    assert figures["seeds"] == 3 and [r["seed"] for r in figures["per_seed"]] == [3, 4, 5]
    assert all(figures["faults"][kind] >= 1 for kind in FAULT_KINDS), figures["faults"]
    assert figures["failed_seeds"] == []
    for r in figures["per_seed"]:
        assert r["wrong_tokens"] == 0 and r["engine_crashes"] == 0
        assert r["corrupt_blocks_on_restart"] == 0 and r["corrupt_blocks_at_end"] == 0
        assert r["requests_served"] > 0
        assert r["tokens_compared"] == 8 * r["requests_served"]
        kills = r["faults"]["engine_kill"] + r["faults"]["engine_kill_full_disk"]
        assert r["engine_restarts"] == kills
    assert figures["requests_served"] == sum(r["requests_served"] for r in figures["per_seed"])
    assert list(tmp_path.iterdir()) == [out], "the soak left its scratch directory behind"


def test_wrong_tokens_are_counted_position_by_position(tmp_path: Path) -> None:
    soak = Soak(SoakOptions(), tmp_path, out=io.StringIO())
    turn = Turn(conversation=0, prompt=(1, 2), expected=(5, 6, 7, 8))
    reply = {"failed_loads": 2, "loaded_blocks": 3, "hits": {"DISK": 3}, "gpu_hit_blocks": 1}
    soak._check(turn, {**reply, "tokens": [5, 6, 7, 8]})
    soak._check(turn, {**reply, "tokens": [5, 0, 7]})  # one wrong, one missing
    assert soak.counts["wrong_tokens"] == 2
    assert soak.counts["tokens_compared"] == 8
    assert soak.counts["failed_loads_recomputed"] == 4
    assert soak.hits == {"DISK": 6, "GPU": 2}
    assert "WRONG TOKENS" in soak.out.getvalue()  # type: ignore[attr-defined]


def block_store(directory: Path) -> tuple[DiskStore, list[bytes]]:
    store = DiskStore.open(directory, b"\x07" * 32, 1 << 20)
    keys = [bytes([i]) * 32 for i in range(1, 5)]
    for key in keys:
        store.write(key, np.full(8192, key[0], dtype=np.uint8))
    return store, keys


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_the_restart_check_finds_damage_the_soak_did_not_do(tmp_path: Path, how: str) -> None:
    area = DiskArea.__new__(DiskArea)  # the checks only; no tmpfs
    area.root = tmp_path
    store, _ = block_store(area.engine_dir("a"))
    store.close()
    assert area.corrupt_blocks("a", set()) == []
    damaged = area.damage("a", how, random.Random(how == "flip"))
    assert damaged is not None
    if how == "flip":  # a flip in the zero padding of the header region is harmless
        segment, offset = damaged.name.split("@")  # so flip a payload byte too
        with open(damaged.with_name(segment), "r+b") as f:
            f.seek(int(offset) + 5000)
            byte = f.read(1)
            f.seek(int(offset) + 5000)
            f.write(bytes([byte[0] ^ 1]))
    found = area.corrupt_blocks("a", set())
    assert len(found) == 1 and found[0].startswith(damaged.name)
    assert area.corrupt_blocks("a", {damaged}) == [], "damage the soak did is not counted"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_is_a_real_enospc_and_comes_back(tmp_path: Path) -> None:
    area = DiskArea(tmp_path / "disk", 4 * 2**20)
    try:
        assert area.mounted
        taken = area.fill()
        assert 4 * 2**20 - 65536 <= taken <= 4 * 2**20
        with pytest.raises(OSError) as err:
            (area.root / "more").write_bytes(b"x" * 65536)
        assert err.value.errno == errno.ENOSPC
        area.unfill()
        (area.root / "more").write_bytes(b"x" * 65536)
    finally:
        area.close()
    assert not area.mounted


def test_a_hybrid_model_soaks_with_every_token_right(tmp_path: Path) -> None:
    """A Gemma 3-style hybrid (a 16-token window: one block) under the same faults."""
    require_redis()
    out = tmp_path / "soak.json"
    argv = ["soak", "--duration", "6", "--fault-interval", "0.4", "--sliding-window", "16"]
    assert main([*argv, "--json", str(out), "--workdir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["sliding_window"] == 16
    r = doc["results"]
    assert r["wrong_tokens"] == 0 and r["engine_crashes"] == 0
    assert r["corrupt_blocks_on_restart"] == 0 and r["corrupt_blocks_at_end"] == 0
    assert r["tokens_compared"] == 8 * r["requests_served"] > 0
    assert r["loaded_blocks"] > 0  # windows came back from the tiers
