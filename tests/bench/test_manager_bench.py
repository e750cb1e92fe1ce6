"""``kvtier bench manager`` end to end on tiny tiers (no timing asserted).

Each policy is measured at every size, unpinned and pinned, paired with LRU in the
same rounds; progress goes to stderr, one line per measurement; the defaults are the
three sizes of the hot-path budget.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from kvtier.bench import manager
from kvtier.cli import main
from kvtier.errors import ConfigError

OPS = {"lookup", "touch", "load", "store_evict"}


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "m.json"
    argv = ["bench", "manager", "--rounds", "3", "--repeats", "2", "--json", str(out), *extra]
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_each_policy_is_measured_at_each_size_with_lru_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _run(tmp_path, "--blocks", "256", "--blocks", "512", "--policy", "lru", "--policy", "arc")
    assert doc["benchmark"] == "manager"
    assert doc["config"]["blocks"] == [256, 512] and doc["config"]["policies"] == ["lru", "arc"]
    results = doc["results"]
    assert list(results) == ["256", "512"]
    assert {size: list(by_policy) for size, by_policy in results.items()} == {
        "256": ["lru", "arc"],
        "512": ["lru", "arc"],
    }
    assert list(results["256"]["arc"]) == ["0", "64"]  # a quarter of the tier pinned
    assert list(results["512"]["arc"]) == ["0", "128"]
    for by_policy in results.values():
        for policy, by_pin in by_policy.items():
            for figures in by_pin.values():
                assert set(figures) == {"cpu", "wall", "lru_cpu", "ratio_to_lru"}
                assert all(set(f) == OPS for f in figures.values())
                if policy == "lru":  # measured alone: its own figures, ratio 1
                    assert figures["lru_cpu"] == figures["cpu"]
                    assert set(figures["ratio_to_lru"].values()) == {1.0}
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if line.startswith("bench manager:")]
    assert progress == [
        "bench manager: 256 blocks, lru, 0 pinned (1/8)",
        "bench manager: 256 blocks, lru, 64 pinned (2/8)",
        "bench manager: 256 blocks, arc, 0 pinned (3/8)",
        "bench manager: 256 blocks, arc, 64 pinned (4/8)",
        "bench manager: 512 blocks, lru, 0 pinned (5/8)",
        "bench manager: 512 blocks, lru, 128 pinned (6/8)",
        "bench manager: 512 blocks, arc, 0 pinned (7/8)",
        "bench manager: 512 blocks, arc, 128 pinned (8/8)",
    ]
    assert (
        "256 blocks: CPU ns/block" in captured.out
        and "manager: worst CPU cost x LRU" in captured.out
    )


def test_a_given_pin_count_is_used_at_every_size(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--blocks", "200", "--pinned", "0", "--policy", "lru")
    assert list(doc["results"]["200"]["lru"]) == ["0"]  # unpinned once, not twice
    doc = _run(tmp_path / "b", "--blocks", "200", "--pinned", "7", "--policy", "lru")
    assert list(doc["results"]["200"]["lru"]) == ["0", "7"]


def test_the_defaults_are_the_budgets_sizes() -> None:
    parser = argparse.ArgumentParser()
    manager.add_arguments(parser)
    args = parser.parse_args([])
    assert args.blocks is None and args.pinned is None
    assert manager.SIZES == (4096, 65_536, 1_000_000)


def test_pins_that_leave_no_room_for_a_batch_are_refused_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager, "measure", None)  # never reached
    parser = argparse.ArgumentParser()
    manager.add_arguments(parser)
    args = parser.parse_args(["--blocks", "4096", "--blocks", "80", "--json", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="20 pinned \\+ a batch of 64 exceed --blocks 80"):
        manager.main(args)


def test_every_policy_but_lru_runs_beside_an_lru_tier_of_its_size_and_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[tuple[str, int, int]] = []
    tier = manager._Tier

    def recording(policy: str, blocks: int, pinned: int, *rest: int) -> manager._Tier:
        built.append((policy, blocks, pinned))
        return tier(policy, blocks, pinned, *rest)

    monkeypatch.setattr(manager, "_Tier", recording)
    _run(tmp_path, "--blocks", "256", "--pinned", "16", "--policy", "lru", "--policy", "slru")
    assert built == [
        ("lru", 256, 0),
        ("lru", 256, 16),
        ("slru", 256, 0),
        ("lru", 256, 0),
        ("slru", 256, 16),
        ("lru", 256, 16),
    ]
