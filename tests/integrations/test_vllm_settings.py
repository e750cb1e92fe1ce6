"""kvtier's keys in vLLM's kv_connector_extra_config (plain Python: runs without vLLM)."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.integrations.vllm.settings import VllmSettings

BASE = {
    "spec_name": "KvtierOffloadingSpec",
    "spec_module_path": "kvtier.integrations.vllm",
    "cpu_bytes_to_use": "8MiB",
}


def test_vllm_keys_pass_and_kvtier_keys_validate() -> None:
    s = VllmSettings.from_extra_config(
        {**BASE, "block_size": 64, "eviction_policy": "arc", "offload_prompt_only": False}, 64
    )
    assert s.offloading.cpu_bytes_to_use == 8 * 2**20
    assert s.offloading.block_size == 64
    assert s.offloading.eviction_policy == "arc"
    assert s.shm_dir == "/dev/shm"


def test_block_size_comes_from_vllms_resolution_not_the_raw_key() -> None:
    s = VllmSettings.from_extra_config({**BASE, "blocks_per_chunk": 2}, 64)
    assert s.offloading.block_size == 64


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"cpu_byte_to_use": 1}, "cpu_byte_to_use", "did you mean 'cpu_bytes_to_use'"),
        ({"hash_algorithm": "sha256"}, "hash_algorithm", "vLLM hashes blocks itself"),
        ({"store_policy": "eager"}, "store_policy", "vLLM's connector decides"),
        ({"canonical_layout": True}, "canonical_layout", "each rank's own pages"),
        ({"eviction_policy": "fifo"}, "eviction_policy", "choose one of"),
        ({"disk_path": "/tmp/x"}, "disk_bytes_to_use", "required with disk_path"),
        ({"remote_url": "http://x"}, "remote_url", "redis://"),
        ({"shm_dir": ""}, "shm_dir", "directory path"),
    ],
)
def test_bad_keys_raise_config_error_naming_them(extra: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        VllmSettings.from_extra_config({**BASE, **extra}, 32)
    assert err.value.key == key
    assert words in str(err.value)


def test_missing_cpu_bytes_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        VllmSettings.from_extra_config({"spec_name": "KvtierOffloadingSpec"}, 32)
    assert err.value.key == "cpu_bytes_to_use"
