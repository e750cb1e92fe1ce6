"""The few transformers calls whose shape changed between 4.45 and 5.x, in one place.

Runs in the engine process. The model runner talks to Hugging Face models only through
these functions and plain ``model(...)`` keywords that every version since 4.45 takes
(``input_ids``, ``attention_mask``, ``position_ids``, ``use_cache``); it never passes
``cache_position``, which 5.x dropped: every version derives it from the cache length,
which is what the runner wants.

What differs:

* the cache keyword: ``cache`` (5.24+, where ``past_key_values`` warns that it goes
  in 5.40) versus ``past_key_values`` (4.45 .. 5.23);

* reading a layer back from a ``DynamicCache``: ``cache.layers[i].keys`` (5.x, late 4.x)
  versus ``cache.key_cache[i]`` (4.45 ..);
* asking for the last position's logits only: ``logits_to_keep`` (4.50+) versus
  ``num_logits_to_keep`` (4.45 .. 4.49); without either, all logits are computed.

Building a cache is the same everywhere: ``DynamicCache()`` then ``update(k, v, layer)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel


def cache_from_past(past: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A ``DynamicCache`` holding ``past[layer] = (K, V)``, each ``(batch, heads, seq, dim)``.

    An empty ``past`` gives an empty cache, which the model fills on its first forward.
    """
    cache = DynamicCache()
    for layer, (k, v) in enumerate(past):
        cache.update(k, v, layer)
    return cache


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer of a cache, each ``(batch, heads, seq, dim)``."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        entry = layers[layer]
        return entry.keys, entry.values
    # transformers < 4.56: per-layer lists on the cache itself.
    return cache.key_cache[layer], cache.value_cache[layer]  # type: ignore[attr-defined]


def cache_keyword(model: PreTrainedModel) -> str:
    """The keyword under which ``model.forward`` takes the cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def last_logits_kwargs(model: PreTrainedModel) -> dict[str, Any]:
    """Keywords that make ``model(...)`` compute logits for the last position only."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}
