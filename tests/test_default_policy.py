"""One default policy everywhere: left at its defaults, the reference engine, vLLM's
spec and ``kvtier run`` all run ``lru`` (``kvtier simulate`` replays it too:
``tests/sim/test_cli.py``), so that a replay's hits are the ones an engine gets.

Each entry point is checked against the literal name, not against
``DEFAULT_EVICTION_POLICY``, so that a default that drifts in one place fails here
whichever place it is.
"""

from __future__ import annotations

from kvtier import cli
from kvtier.config import DEFAULT_EVICTION_POLICY, OffloadingConfig
from kvtier.integrations.vllm.settings import VllmSettings
from kvtier.keys import ModelFingerprint
from kvtier.offloading_spec import KVGeometry, OffloadingSpec
from kvtier.run.configs import build_configurations
from kvtier.scheduler.policies.lru import LRUPolicy

FP = ModelFingerprint(model_id="default-test", dtype="float16", kv_layout="kv_first", block_size=4)
GEOMETRY = KVGeometry(gpu_block_size=4, page_bytes=512, fingerprint=FP)


def test_the_engines_default_is_lru() -> None:
    assert DEFAULT_EVICTION_POLICY == "lru"
    assert OffloadingConfig.from_dict({"cpu_bytes_to_use": "1MiB"}).eviction_policy == "lru"


def test_the_reference_engines_tier_runs_lru_by_default() -> None:
    manager = OffloadingSpec({"cpu_bytes_to_use": 64 * 512}, GEOMETRY).get_manager()
    assert type(manager.primary.policy) is LRUPolicy


def test_vllms_spec_runs_the_engines_default() -> None:
    extra = {
        "spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": "8MiB",
    }
    settings = VllmSettings.from_extra_config(extra, 64)
    assert settings.offloading.eviction_policy == "lru"


def test_kvtier_run_compares_the_engines_default() -> None:
    args = cli.build_parser(["run"]).parse_args(["run"])
    assert args.eviction_policy == "lru"
    configs = build_configurations(("none", "cpu", "cpu+disk"), 2**20, 16, "/nonexistent")
    offloads = [c.offload for c in configs if c.offload is not None]
    assert [o["eviction_policy"] for o in offloads] == ["lru", "lru"]
    assert offloads[1]["disk_eviction_policy"] == "lru"
