"""The engine's models: the embedded default Llama, and local Hugging Face checkpoints.

Runs in the engine process, on the model's device. Nothing is ever downloaded: the
default model is a small ``LlamaForCausalLM`` built from a config with seeded random
weights, and ``load_model(path)`` only reads a local checkpoint directory. A
``ModelSize`` with a ``sliding_window`` builds a hybrid instead: a Gemma 3-style model
(``Gemma3ForCausalLM``, transformers >= 4.50) whose layers attend to the last
``sliding_window`` tokens only, every ``full_every``-th one to the whole prefix.
``save_model`` writes either as a checkpoint, for ``kvtier run --model``.

The default weights are drawn by kvtier itself, parameter by parameter in name order
from one seeded CPU generator, rather than by transformers' own initialisation (which
changes between versions). The same seed therefore gives the same weights in every
process, on every machine, and on CPU or GPU (the weights are drawn in float32 on the
CPU, then cast and moved).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from kvtier.engine.kv_pool import KVShape
from kvtier.errors import ConfigError
from kvtier.keys import ModelFingerprint
from kvtier.weights import weights_digest


@dataclass(frozen=True, slots=True)
class ModelSize:
    """The shape of a model built from scratch: a Llama, or a sliding-window hybrid.

    The default is sized so that a 2,000-token prefill takes a few seconds on two CPU
    cores (about 4 s measured on the development machine; see ``docs/engine.md``).
    KV per token: ``2 * num_layers * num_kv_heads * head_dim`` elements (6 KiB in
    float32 for the default).

    With ``sliding_window`` set, the model is Gemma 3-style: layer ``i`` attends to the
    whole prefix when ``(i + 1) % full_every == 0`` and to the last ``sliding_window``
    tokens otherwise (Gemma 3's own pattern is 5 sliding layers to 1 full). Every
    layer's KV is kept, so offloading stores all of it, as for a Llama.
    """

    vocab_size: int = 16384
    hidden_size: int = 768
    intermediate_size: int = 2048
    num_layers: int = 6
    num_heads: int = 12
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    init_std: float = 0.02
    sliding_window: int | None = None
    full_every: int = 6

    def to_config(self) -> PretrainedConfig:
        """The transformers config of this size (no special tokens: greedy to max length).

        Raises:
            ConfigError: a hybrid (``sliding_window``) with a transformers older than
                4.50, which has no Gemma 3.
        """
        if self.sliding_window is not None:
            return self._hybrid_config()
        return LlamaConfig(**self._shared_settings())

    def _shared_settings(self) -> dict[str, Any]:
        """What the Llama and the hybrid are given alike."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.init_std,
            "tie_word_embeddings": False,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }

    def _hybrid_config(self) -> PretrainedConfig:
        try:
            from transformers import Gemma3TextConfig
        except ImportError as e:
            raise ConfigError(
                "sliding_window", f"a hybrid model needs transformers >= 4.50 (Gemma 3): {e}"
            ) from e
        if self.sliding_window is None or self.sliding_window < 1 or self.full_every < 1:
            raise ConfigError(
                "sliding_window",
                f"needs a window of at least 1 token and full_every >= 1, got "
                f"{self.sliding_window} and {self.full_every}",
            )
        layer_types = [
            "full_attention" if (i + 1) % self.full_every == 0 else "sliding_attention"
            for i in range(self.num_layers)
        ]
        return Gemma3TextConfig(
            **self._shared_settings(),
            head_dim=self.hidden_size // self.num_heads,
            sliding_window=self.sliding_window,
            layer_types=layer_types,
        )


DEFAULT_MODEL_SIZE = ModelSize()


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device to run on: the one asked for, else CUDA when available, else the CPU."""
    if device is not None:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError("device", f"{device!r} is not a torch device ({e})") from e
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: torch.dtype | None = None) -> torch.dtype:
    """The dtype to run in: the one asked for, else float32 on CPU, bf16 (or fp16) on GPU."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError("dtype", f"{dtype!r} is not a floating-point torch dtype")
        return dtype
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def build_model(
    size: ModelSize = DEFAULT_MODEL_SIZE,
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """Build a Llama (or, with ``size.sliding_window``, a hybrid) with seeded random
    weights, in eval mode.

    Args:
        size: the model's shape.
        seed: the weights' seed; equal seeds give equal weights in every process.
        device: where the model runs (default: CUDA if available, else CPU).
        dtype: the weights' dtype (default: float32 on CPU, bf16/fp16 on GPU).
    """
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    config = size.to_config()
    model = (
        LlamaForCausalLM(config)
        if isinstance(config, LlamaConfig)
        else AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    )
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                values = torch.randn(param.shape, generator=gen, dtype=torch.float32)
                param.copy_(values * size.init_std)
    return place(model, dev, dt)


def save_model(size: ModelSize, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the model ``build_model(size, seed)`` builds (on the CPU, float32) as a
    local checkpoint directory, for ``load_model`` and ``kvtier run --model``."""
    directory = Path(path)
    build_model(size, seed=seed, device="cpu", dtype=torch.float32).save_pretrained(directory)
    return directory


def place(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """Move and cast a model in place, and put it in eval mode (inference only)."""
    # PreTrainedModel.to is wrapped by transformers, which hides its signature from mypy.
    model.to(device=device, dtype=dtype)  # type: ignore[call-arg]
    model.train(False)  # eval mode; PreTrainedModel.eval is unannotated
    return model


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """The default model (``path=None``) or a local Hugging Face causal-LM checkpoint.

    Args:
        path: a checkpoint directory (``config.json`` and weights); never downloaded.
        device: where the model runs (default: CUDA if available, else CPU).
        dtype: the dtype to run in (default: float32 on CPU, bf16/fp16 on GPU).
        seed: the default model's weights seed (ignored for a checkpoint).

    Raises:
        ConfigError: ``path`` is not a directory holding a checkpoint transformers can load.
    """
    if path is None:
        return build_model(DEFAULT_MODEL_SIZE, seed=seed, device=device, dtype=dtype)
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ConfigError(
            "model", f"{str(path)!r} is not a local checkpoint directory (no config.json)"
        )
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    try:
        # Loaded in its stored dtype, then cast: the dtype keyword of from_pretrained was
        # renamed between transformers 4.x and 5.x.
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError("model", f"cannot load checkpoint {str(path)!r}: {e}") from e
    return place(model, dev, dt)


_NOT_IDENTITY = frozenset(
    {
        "_name_or_path",
        "name_or_path",
        "architectures",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "attn_implementation",
        "use_cache",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "_commit_hash",
    }
)
"""Config keys that do not change the KV bytes (bookkeeping, or set by saving/loading
a checkpoint); the dtype is part of the fingerprint on its own."""


def model_fingerprint(
    model: PreTrainedModel, layout: KVShape, block_size: int, parallel: str = "tp1/rank0"
) -> ModelFingerprint:
    """The identity block keys and stored blocks are rooted in (``kvtier.keys``, ``docs/keys.md``).

    It names the model (its path or class and a digest of its config), digests its
    weights as loaded (``kvtier.weights``: the only part that costs anything, once per
    load), and records the KV dtype and layout, the page size and the parallel layout.
    Two engines share offloaded blocks only when all of these match.
    """
    config = model.config
    fields = {k: v for k, v in config.to_dict().items() if k not in _NOT_IDENTITY}
    canonical = json.dumps(fields, sort_keys=True, default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    name = getattr(config, "name_or_path", "") or type(model).__name__
    return ModelFingerprint(
        model_id=f"{name}|config={digest}",
        dtype=str(layout.dtype).removeprefix("torch."),
        kv_layout=(
            f"(2,blocks,block_size,heads,head_dim) layers={layout.num_layers} "
            f"kv_heads={layout.num_kv_heads} head_dim={layout.head_dim}"
        ),
        block_size=block_size,
        parallel=parallel,
        weights=weights_digest(model.state_dict().items()),
    )
