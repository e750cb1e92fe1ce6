"""The reference engine: a small paged-KV inference engine over Hugging Face transformers.

Runs in one process, on CUDA when available, else on the CPU::

    from kvtier.engine import LLM
    llm = LLM(num_gpu_blocks=256, block_size=16)
    outputs = llm.generate([[1, 2, 3]], max_new_tokens=16)   # greedy
    llm.last_stats.gpu_hit_tokens, llm.last_stats.ttft_s

Modules, one concept each: ``models`` (default model, checkpoint loading), ``kv_pool``
(the pages), ``block_manager`` (GPU prefix cache), ``model_runner`` (forward over
pages), ``scheduler`` (admission, batching, preemption), ``connector_api`` (where
offloading plugs in), ``llm`` (the loop). See ``docs/engine.md``.
"""

from kvtier.engine.connector_api import (
    Connector,
    LoadHandle,
    LoadState,
    NoOpConnector,
    OffloadStats,
)
from kvtier.engine.llm import LLM
from kvtier.engine.models import DEFAULT_MODEL_SIZE, ModelSize, build_model, load_model
from kvtier.engine.stats import EngineStats, RequestStats

__all__ = [
    "DEFAULT_MODEL_SIZE",
    "LLM",
    "Connector",
    "EngineStats",
    "LoadHandle",
    "LoadState",
    "ModelSize",
    "NoOpConnector",
    "OffloadStats",
    "RequestStats",
    "build_model",
    "load_model",
]
