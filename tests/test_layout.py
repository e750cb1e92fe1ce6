"""The layout is the architecture: the scheduler side never imports torch.

Every torch-free module is imported in a fresh interpreter where importing torch or
transformers raises: the scheduler package and its policies, the tiering and its
background discovery, the connector's scheduler half and the values it trades, the
simulator, configuration and keys.
"""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import importlib, pkgutil, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("torch", "transformers"):
            raise ImportError(f"the scheduler side must not import {top}")
        return None
sys.meta_path.insert(0, NoTorch())
import kvtier.scheduler, kvtier.sim
modules = [
    "kvtier.blocks", "kvtier.config", "kvtier.errors", "kvtier.keys", "kvtier.specs",
    "kvtier.jobs", "kvtier.connector", "kvtier.connector.scheduler_half",
    "kvtier.connector.stats", "kvtier.scheduler.tiering", "kvtier.scheduler.discovery",
]
for package in (kvtier.scheduler, kvtier.sim):
    modules += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in modules:
    importlib.import_module(name)
from kvtier.scheduler import CPUOffloadingManager
m = CPUOffloadingManager(num_blocks=2, block_size=16)
assert m.prepare_store([b"a"]) is not None
assert "torch" not in sys.modules and "transformers" not in sys.modules
print(len(modules))
"""


def test_scheduler_side_imports_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 30, "the walk found fewer modules than the packages hold"
