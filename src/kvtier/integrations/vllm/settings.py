"""kvtier's keys in vLLM's ``kv_connector_extra_config``: validated once, frozen.

Runs in every vLLM process that builds the spec (EngineCore and each worker); pure
Python, no vLLM import, so it is tested without vLLM. vLLM passes its whole
``kv_connector_extra_config`` to the spec; some keys are vLLM's own (its connector
reads them), the rest are kvtier's ``OffloadingConfig`` keys. Anything else is
refused with ``ConfigError`` naming the key and the closest known key, so a typo
(``"cpu_byte_to_use"``) fails at start-up instead of silently running without it.

``block_size`` is vLLM's key (tokens per offloaded block; vLLM turns it into
``blocks_per_chunk``); kvtier takes the resulting size from vLLM's config rather than
from the raw value, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvtier.config import OffloadingConfig, check_known
from kvtier.errors import ConfigError

VLLM_KEYS = frozenset(
    {
        "spec_name",
        "spec_module_path",
        "block_size",
        "blocks_per_chunk",
        "offload_prompt_only",
        "self_describing_kv_events",
        "sync_load_budget_bytes",
        "canonical_layout",
    }
)
"""Keys vLLM's OffloadingConnector reads itself; kvtier lets them through."""

NOT_IN_VLLM = {
    "hash_algorithm": "vLLM hashes blocks itself (its prefix_caching_hash_algo)",
    "store_policy": "vLLM's connector decides which blocks to store",
}
"""kvtier keys that mean nothing under vLLM, and why."""

KVTIER_VLLM_KEYS = frozenset({"shm_dir", "model_identity"})
"""Keys only the vLLM integration has."""


@dataclass(frozen=True, slots=True)
class VllmSettings:
    """kvtier's settings for one vLLM engine.

    Attributes:
        offloading: kvtier's validated configuration; its ``block_size`` is the
            offloaded block in tokens (vLLM's ``tokens_per_block * blocks_per_chunk``).
        shm_dir: the directory of the CPU tier's shared-memory file (``/dev/shm``).
        model_identity: the user's name for the weights (e.g. a checkpoint's commit or
            digest), part of the storage fingerprint beside the checkpoint digest;
            ``""``: none given.
    """

    offloading: OffloadingConfig
    shm_dir: str = "/dev/shm"
    model_identity: str = ""

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any], block_size: int) -> VllmSettings:
        """Validate ``kv_connector_extra_config``.

        Args:
            extra: the mapping as vLLM passes it.
            block_size: tokens per offloaded block, as vLLM resolved it.

        Raises:
            ConfigError: naming the key: unknown (with the closest known key), not
                meaningful under vLLM, or invalid for kvtier.
        """
        if not isinstance(extra, Mapping):
            raise ConfigError(
                "kv_connector_extra_config", f"expected a mapping, got {type(extra).__name__}"
            )
        kvtier_keys = {f.name for f in fields(OffloadingConfig)} - {"block_size"}
        known = sorted(VLLM_KEYS | kvtier_keys | KVTIER_VLLM_KEYS)
        for key in extra:
            if key in NOT_IN_VLLM:
                raise ConfigError(
                    str(key), f"is not used under vLLM: {NOT_IN_VLLM[key]}; remove it"
                )
        check_known(extra, known)
        if extra.get("canonical_layout"):
            raise ConfigError(
                "canonical_layout",
                "kvtier stores each rank's own pages (storage keys name the rank); "
                "remove canonical_layout or set it to false",
            )
        raw = {k: v for k, v in extra.items() if k in kvtier_keys}
        offloading = OffloadingConfig.from_dict({**raw, "block_size": block_size})
        shm_dir = extra.get("shm_dir", "/dev/shm")
        if not isinstance(shm_dir, str) or not shm_dir:
            raise ConfigError("shm_dir", f"must be a directory path, got {shm_dir!r}")
        model_identity = extra.get("model_identity", "")
        if not isinstance(model_identity, str):
            raise ConfigError(
                "model_identity",
                f"must be a string naming the weights, got {type(model_identity).__name__}",
            )
        return cls(offloading=offloading, shm_dir=shm_dir, model_identity=model_identity)
