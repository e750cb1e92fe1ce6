"""kvtier inside vLLM (``pip install kvtier[vllm]``): see ``docs/vllm.md``.

Two routes:

* ``KvtierOffloadingSpec`` -- kvtier's whole offloading (CPU tier with kvtier's
  policies, disk and Redis behind it) as vLLM's offloading spec::

      "kv_connector": "OffloadingConnector",
      "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
                                    "spec_module_path": "kvtier.integrations.vllm", ...}

* ``KvtierDiskTier`` / ``KvtierRedisTier`` -- kvtier's verified disk tier and its Redis
  tier as secondary tiers of vLLM's own ``TieringOffloadingSpec`` (vLLM >= 0.33)::

      "secondary_tiers": [{"type": "KvtierRedisTier",
                           "module_path": "kvtier.integrations.vllm", ...}]

The package itself imports without vLLM (its settings and region are plain Python);
the classes above import vLLM when first named.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KvtierDiskTier", "KvtierOffloadingSpec", "KvtierRedisTier"]

_LAZY = {
    "KvtierOffloadingSpec": "kvtier.integrations.vllm.spec",
    "KvtierDiskTier": "kvtier.integrations.vllm.secondary",
    "KvtierRedisTier": "kvtier.integrations.vllm.secondary",
}


def __getattr__(name: str) -> Any:
    """Import a vLLM-facing class on first use (vLLM's loaders call ``getattr``)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
