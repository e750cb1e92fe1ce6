"""The checkpoint digest that names a vLLM engine's stored blocks (pure Python: runs in
the main suite, no vLLM needed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.integrations.vllm.checkpoint import (
    SAMPLE_WINDOWS,
    WINDOW_BYTES,
    checkpoint_digest,
    sample_offsets,
)
from kvtier.integrations.vllm.settings import VllmSettings

BIG = 3 * SAMPLE_WINDOWS * WINDOW_BYTES + 123  # sampled, not read whole


def checkpoint(path: Path, seed: int = 0) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (path / "model.safetensors").write_bytes(bytes((seed + i * 7) % 251 for i in range(BIG)))
    return path


def test_a_copy_elsewhere_has_the_same_digest_and_other_weights_another(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a")
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    os.utime(copy / "model.safetensors", (1, 1))  # other mtimes do not matter
    assert len(checkpoint_digest(str(a))) == 64
    assert checkpoint_digest(str(copy)) == checkpoint_digest(str(a))
    tuned = checkpoint(tmp_path / "tuned", seed=1)  # same size, same names, other bytes
    assert checkpoint_digest(str(tuned)) != checkpoint_digest(str(a))


@pytest.mark.parametrize("offset", [0, sample_offsets(BIG)[SAMPLE_WINDOWS // 2] + 5, BIG - 1])
def test_a_change_in_a_sampled_window_changes_the_digest(tmp_path: Path, offset: int) -> None:
    a = checkpoint(tmp_path / "a")
    before = checkpoint_digest(str(a))
    raw = bytearray((a / "model.safetensors").read_bytes())
    raw[offset] ^= 0xFF
    (a / "model.safetensors").write_bytes(bytes(raw))
    assert checkpoint_digest(str(a)) != before


def test_names_sizes_and_files_count_hidden_files_do_not(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a")
    before = checkpoint_digest(str(a))
    (a / ".cache").write_text("written by a tool")  # hidden: ignored
    (a / "sub").mkdir()  # subdirectories: ignored
    assert checkpoint_digest(str(a)) == before
    (a / "model.safetensors").rename(a / "other.safetensors")
    assert checkpoint_digest(str(a)) != before
    (a / "other.safetensors").rename(a / "model.safetensors")
    assert checkpoint_digest(str(a)) == before
    with open(a / "model.safetensors", "ab") as f:
        f.write(b"\0")
    assert checkpoint_digest(str(a)) != before


def test_a_single_file_checkpoint_is_digested_and_an_unknown_name_is_not(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a")
    assert checkpoint_digest(str(a / "model.safetensors")) not in ("", checkpoint_digest(str(a)))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    assert checkpoint_digest("no-such-org/no-such-model-kvtier") == ""


def test_sample_offsets_cover_small_files_whole_and_spread_over_large_ones() -> None:
    assert sample_offsets(0) == [0] and sample_offsets(WINDOW_BYTES) == [0]
    assert sample_offsets(WINDOW_BYTES + 1) == [0, WINDOW_BYTES]
    whole = SAMPLE_WINDOWS * WINDOW_BYTES
    assert sample_offsets(whole) == list(range(0, whole, WINDOW_BYTES))
    spread = sample_offsets(BIG)
    assert len(spread) == SAMPLE_WINDOWS and spread[0] == 0
    assert spread[-1] == BIG - WINDOW_BYTES and spread == sorted(set(spread))


def test_model_identity_is_a_string_key() -> None:
    s = VllmSettings.from_extra_config({"cpu_bytes_to_use": 1 << 20, "model_identity": "v2"}, 16)
    assert s.model_identity == "v2"
    assert VllmSettings.from_extra_config({"cpu_bytes_to_use": 1 << 20}, 16).model_identity == ""
    with pytest.raises(ConfigError, match="model_identity"):
        VllmSettings.from_extra_config({"cpu_bytes_to_use": 1 << 20, "model_identity": 3}, 16)
