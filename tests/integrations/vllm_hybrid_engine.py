"""Real vLLM engines (vLLM's CPU build) over hybrid models, run as a script: one child process.

``python vllm_hybrid_engine.py CONFIG.json`` runs, for each architecture of the
config, its engines one after another, each a ``vllm.LLM`` built in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM's scheduler and its worker run here, on
threads, and kvtier's spec is built twice, its scheduler side and its worker side, as
in production, sharing the CPU tier through its shared-memory region). In-process
engines start in a few seconds instead of most of a minute, so each architecture gets
its own engines for every tier; ``vllm_engine.py`` runs the production layout (vLLM's
EngineCore in its own process) for the single-group model.

Config: ``{"archs": [{"arch", "model", "engines": [{"name", "engine_id",
"extra_config" (absent: vLLM without the connector), "engine_args" (more
``vllm.LLM`` arguments, optional), "steps"}]}]}``. Steps:
``{"generate": [[token ids], ...]}`` (one batch, greedy, 8 tokens each) and
``{"reset": true}`` (vLLM's GPU prefix cache emptied, its connector's tiers kept).
Prints one line, ``RESULT {json}``: for each architecture, its KV cache groups (the
kind and layers of each, from vLLM's scheduler) and, for each engine, every
generation's tokens, their log-probabilities and ``num_cached_tokens``, and vLLM's
counters (kvtier's ``vllm:kv_offload_kvtier_*`` among them), or the error it raised.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

GPU_BLOCK = 32  # tokens per vLLM block: the CPU backend needs a multiple of 32
NUM_GPU_BLOCKS = 256
MAX_TOKENS = 8

_COUNTERS = (
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_hits",
    "vllm:kv_offload_kvtier_tier_hits",
    "vllm:kv_offload_kvtier_loaded_blocks",
    "vllm:kv_offload_kvtier_lookups",
    "vllm:kv_offload_kvtier_promotions",
    "vllm:kv_offload_kvtier_promotion_failures",
)


def groups_of(llm: Any) -> list[dict[str, Any]]:
    """vLLM's KV cache groups, read from its in-process scheduler (a diagnostic: the
    tests check the architecture is the hybrid it is meant to be)."""
    config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    return [
        {"kind": type(g.kv_cache_spec).__name__, "layers": list(g.layer_names)}
        for g in config.kv_cache_groups
    ]


def counters(llm: Any) -> dict[str, int]:
    """vLLM's counters, ``name{label=value,...}`` (the engine labels left out)."""
    out: dict[str, int] = {}
    for metric in llm.get_metrics():
        if metric.name not in _COUNTERS:
            continue
        labels = ",".join(
            f"{k}={v}"
            for k, v in sorted(metric.labels.items())
            if k not in ("model_name", "engine")
        )
        name = f"{metric.name}{{{labels}}}" if labels else metric.name
        out[name] = out.get(name, 0) + int(metric.value)
    return out


def run_engine(model: str, engine: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {}
    if engine.get("extra_config") is not None:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "engine_id": engine["engine_id"],
            "kv_connector_extra_config": engine["extra_config"],
        }
    args: dict[str, Any] = {
        "model": model,
        "skip_tokenizer_init": True,
        "dtype": "float32",
        "block_size": GPU_BLOCK,
        "kv_cache_memory_bytes": 64 << 20,
        "num_gpu_blocks_override": NUM_GPU_BLOCKS,
        "max_model_len": 512,
        "max_num_seqs": 4,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "disable_log_stats": False,
        "seed": 0,
        **kwargs,
        **engine.get("engine_args", {}),
    }
    llm = LLM(**args)
    try:
        params = SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False, logprobs=0
        )
        outputs = []
        for step in engine["steps"]:
            if "reset" in step:
                if not llm.reset_prefix_cache():
                    raise RuntimeError("vLLM did not reset its prefix cache")
                continue
            prompts = [TokensPrompt(prompt_token_ids=p) for p in step["generate"]]
            for out in llm.generate(prompts, params, use_tqdm=False):
                completion = out.outputs[0]
                outputs.append(
                    {
                        "tokens": list(completion.token_ids),
                        "logprobs": [
                            lp[t].logprob
                            for lp, t in zip(
                                completion.logprobs or [], completion.token_ids, strict=True
                            )
                        ],
                        "cached": out.num_cached_tokens,
                    }
                )
        return {"groups": groups_of(llm), "outputs": outputs, "counters": counters(llm)}
    finally:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    result: dict[str, Any] = {}
    for arch in cfg["archs"]:
        engines: dict[str, Any] = {}
        for engine in arch["engines"]:
            start = time.monotonic()
            try:
                engines[engine["name"]] = run_engine(arch["model"], engine)
                engines[engine["name"]]["seconds"] = round(time.monotonic() - start, 1)
            except Exception as exc:  # reported, so the other engines still run
                engines[engine["name"]] = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                }
        result[arch["arch"]] = engines
        print(f"DONE {arch['arch']} " + json.dumps(engines), file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
