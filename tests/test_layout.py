"""The layout is the architecture: the scheduler side never imports torch."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("the scheduler side must not import torch")
        return None
sys.meta_path.insert(0, NoTorch())
import kvtier.scheduler, kvtier.keys, kvtier.config, kvtier.specs, kvtier.errors
from kvtier.scheduler import CPUOffloadingManager
m = CPUOffloadingManager(num_blocks=2, block_size=16)
assert m.prepare_store([b"a"]) is not None
assert "torch" not in sys.modules
print("ok")
"""


def test_scheduler_side_imports_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
