"""The CPU tier's shared-memory region (plain Python: runs without vLLM)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.integrations.vllm.region import (
    STORE_FAILED,
    HostRegion,
    RegionLayout,
    reclaim,
    region_path,
)


def test_two_mappings_share_each_ranks_slab_and_status(tmp_path: Path) -> None:
    layout = RegionLayout(num_blocks=3, shard_bytes=8, world_size=2)
    path = region_path(str(tmp_path), "engine/0")
    assert path.name == "kvtier-vllm-engine_0.slab"
    worker = HostRegion.open(path, layout)  # a worker process opens first
    manager = HostRegion.open(path, layout)
    assert path.stat().st_size == 2 * 3 * 8 + 2 * 3
    worker.slab(1)[2] = np.arange(8, dtype=np.uint8)
    worker.status()[1, 2] = STORE_FAILED
    assert manager.slab(1)[2].tolist() == list(range(8))
    assert manager.slab(0).sum() == 0  # rank 0's slab is untouched
    assert manager.status()[:, 2].tolist() == [0, STORE_FAILED]
    manager.unlink()
    assert not path.exists()
    worker.slab(0)[0] = 7  # mappings outlive the name
    assert manager.slab(0)[0, 0] == 7
    manager.close()
    worker.close()


def test_a_live_region_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kvtier-vllm-e.slab"
    live = HostRegion.open(path, RegionLayout(2, 8, 1))
    try:
        with pytest.raises(ConfigError) as err:
            HostRegion.open(path, RegionLayout(4, 8, 1))
        assert err.value.key == "shm_dir"
    finally:
        live.close()


def test_the_last_process_to_close_a_region_removes_it(tmp_path: Path) -> None:
    path = region_path(str(tmp_path), "e")
    layout = RegionLayout(2, 8, 1)
    worker, manager = HostRegion.open(path, layout), HostRegion.open(path, layout)
    worker.close()
    assert path.exists(), "the manager still maps it"
    manager.close()
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file either


def _hold(path: Path, layout: RegionLayout) -> subprocess.Popen[str]:
    """Another process that maps the region and holds it until killed."""
    code = (
        "import sys, time; from pathlib import Path\n"
        "from kvtier.integrations.vllm.region import HostRegion, RegionLayout\n"
        f"layout = RegionLayout({layout.num_blocks}, {layout.shard_bytes}, {layout.world_size})\n"
        f"r = HostRegion.open(Path({str(path)!r}), layout)\n"
        "print('mapped', flush=True); time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "mapped\n"
    return child


def _kill(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()
    assert child.stdout is not None
    child.stdout.close()


def _gone_within(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_a_sigkilled_engines_region_is_removed_by_its_reaper(tmp_path: Path) -> None:
    """vLLM's server SIGKILLs its engine processes right after SIGTERM: no code of
    theirs runs, and the reaper the creator started removes the file."""
    path = region_path(str(tmp_path), "killed")
    child = _hold(path, RegionLayout(4, 8, 1))
    time.sleep(0.5)
    assert path.exists(), "the reaper waits while the engine lives"
    _kill(child)
    assert _gone_within(path, 30), "the reaper removed the file after the kill"


def test_a_start_reclaims_what_no_process_holds_and_never_a_live_neighbours(
    tmp_path: Path,
) -> None:
    layout = RegionLayout(4, 8, 1)
    # A file of an engine killed with its reaper (a whole process group SIGKILLed),
    # and one of a live neighbour on the same host.
    stale = region_path(str(tmp_path), "stale")
    stale.write_bytes(bytes(layout.total_bytes))
    unrelated = tmp_path / "other-program.slab"
    unrelated.write_bytes(b"x")
    neighbour_path = region_path(str(tmp_path), "neighbour")
    neighbour = _hold(neighbour_path, layout)
    try:
        mine = HostRegion.open(region_path(str(tmp_path), "mine"), layout)
        assert not stale.exists()
        assert neighbour_path.exists() and unrelated.exists()
        assert reclaim(tmp_path) == []  # nothing unheld is left
        mine.close()
    finally:
        _kill(neighbour)
    assert _gone_within(neighbour_path, 30)


def test_bad_sizes_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        RegionLayout(0, 8, 1)
    assert err.value.key == "num_blocks"
