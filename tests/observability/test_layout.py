"""The observability package works on the scheduler side: no torch, nothing heavy at import."""

from __future__ import annotations

import subprocess
import sys

NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("observability must not import torch")
        return None
sys.meta_path.insert(0, NoTorch())
import kvtier.observability
assert "prometheus_client" not in sys.modules and "zmq" not in sys.modules
from kvtier.observability import events, exporter, failures, metrics, observer, publisher
from kvtier.scheduler import CPUOffloadingManager
from kvtier.scheduler.tiering import TieredManager
manager = TieredManager(CPUOffloadingManager(4, 16), [])
obs = observer.EngineObserver(manager, 1024, metrics=metrics.EngineMetrics())
assert "torch" not in sys.modules
print("ok")
"""


def test_observability_imports_without_torch_and_lazily() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
