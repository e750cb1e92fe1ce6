"""The engine's models: seeded weights are the same everywhere; checkpoints load locally."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch

from kvtier.engine import DEFAULT_MODEL_SIZE, LLM, ModelSize, build_model, load_model
from kvtier.engine.models import pick_device, pick_dtype
from kvtier.errors import ConfigError

DIGEST = """
import hashlib, sys, torch
from kvtier.engine import ModelSize, build_model
size = ModelSize(**eval(sys.argv[1]))
model = build_model(size, seed=int(sys.argv[2]), device="cpu")
h = hashlib.sha256()
for name, p in sorted(model.state_dict().items()):
    h.update(name.encode()); h.update(p.detach().numpy().tobytes())
print(h.hexdigest())
"""


def digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def digest_in_subprocess(size: ModelSize, seed: int) -> str:
    fields = {f: getattr(size, f) for f in size.__dataclass_fields__}
    out = subprocess.run(
        [sys.executable, "-c", DIGEST, repr(fields), str(seed)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.timeout(600)  # builds models in child processes: 67 s on a loaded machine
def test_weights_depend_only_on_the_seed(tiny_model, tiny_size: ModelSize) -> None:
    assert digest_in_subprocess(tiny_size, 0) == digest(tiny_model)
    assert digest(build_model(tiny_size, seed=1, device="cpu")) != digest(tiny_model)


def test_default_model_shape() -> None:
    config = DEFAULT_MODEL_SIZE.to_config()
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    assert config.hidden_size // config.num_attention_heads == 64


def test_a_saved_checkpoint_loads_and_generates_the_same(tiny_model, tmp_path) -> None:
    tiny_model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, device="cpu", dtype=torch.float32)
    assert digest(loaded) == digest(tiny_model)
    prompt = [[5, 6, 7, 8, 9]]
    a = LLM(tmp_path, num_gpu_blocks=8, block_size=4, device="cpu").generate(prompt, 4)
    b = LLM(tiny_model, num_gpu_blocks=8, block_size=4).generate(prompt, 4)
    assert a == b


def test_device_and_dtype_choice() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device().type == expected
    assert pick_dtype(torch.device("cpu")) is torch.float32
    assert pick_dtype(torch.device("cpu"), torch.float16) is torch.float16
    with pytest.raises(ConfigError) as e:
        pick_device("warp-drive")
    assert e.value.key == "device"
    with pytest.raises(ConfigError):
        pick_dtype(torch.device("cpu"), torch.int8)


def test_not_a_checkpoint(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as e:
        load_model(tmp_path)
    assert e.value.key == "model"


def test_fingerprint_ignores_bookkeeping_but_not_the_architecture(tiny_size) -> None:  # type: ignore[no-untyped-def]
    # Saving a checkpoint sets config.architectures; that must not change the keys,
    # while anything that changes the KV bytes must.
    from kvtier.engine.kv_pool import KVShape
    from kvtier.engine.models import model_fingerprint

    a = build_model(tiny_size, seed=0, device="cpu")
    fp = model_fingerprint(a, KVShape.of_model(a), 4)
    a.config.architectures = ["LlamaForCausalLM"]
    a.config.use_cache = not a.config.use_cache
    assert model_fingerprint(a, KVShape.of_model(a), 4) == fp
    a.config.rope_theta = 1234.0
    assert model_fingerprint(a, KVShape.of_model(a), 4) != fp
    assert model_fingerprint(a, KVShape.of_model(a), 4, parallel="tp2/rank1") != (
        model_fingerprint(a, KVShape.of_model(a), 4, parallel="tp2/rank0")
    )


def test_fingerprint_sees_the_weights(tiny_size) -> None:  # type: ignore[no-untyped-def]
    # Issue 13: two models of one config and name but other weights had one fingerprint
    # (the seed only counted for the embedded default model, never for an instance).
    from kvtier.engine.kv_pool import KVShape
    from kvtier.engine.models import model_fingerprint

    a = build_model(tiny_size, seed=0, device="cpu")
    b = build_model(tiny_size, seed=1, device="cpu")
    again = build_model(tiny_size, seed=0, device="cpu")
    fp_a = model_fingerprint(a, KVShape.of_model(a), 4)
    fp_b = model_fingerprint(b, KVShape.of_model(b), 4)
    assert fp_a.model_id == fp_b.model_id, "same name and config"
    assert fp_a.weights != fp_b.weights and fp_a != fp_b
    assert model_fingerprint(again, KVShape.of_model(again), 4) == fp_a
    with torch.no_grad():  # one weight of one layer nudged: another model
        again.model.layers[1].mlp.down_proj.weight[3, 5] += 0.01
    assert model_fingerprint(again, KVShape.of_model(again), 4).weights != fp_a.weights
