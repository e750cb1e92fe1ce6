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

Importing this package imports vLLM.
"""

from kvtier.integrations.vllm.spec import KvtierOffloadingSpec

__all__ = ["KvtierOffloadingSpec"]
