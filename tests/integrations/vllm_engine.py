"""One real vLLM engine (vLLM's CPU build), run as a script: the e2e tests' child process.

``python vllm_engine.py CONFIG.json`` builds ``vllm.LLM`` over the tiny random Llama in
``model`` (with kvtier's spec when ``extra_config`` is given), runs ``steps`` and prints
one JSON line: each generation's tokens and ``num_cached_tokens``, and vLLM's prefix
cache counters. Each engine gets its own process, so vLLM's process-wide state never
leaks between engines, and vLLM spawns its own EngineCore and worker processes from
it (kvtier's spec is imported there by module path, as in production).

Steps: ``{"generate": [token ids]}``, or ``{"scribble_region": seed}``: overwrite the
CPU tier's shared memory with random bytes (the negative control: the loaded bytes are
used), reached through the region file the way any process on the host could.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GPU_BLOCK = 32  # tokens per vLLM block: the CPU backend needs a multiple of 32
NUM_GPU_BLOCKS = 16
PAGE_BYTES = 2 * 2 * GPU_BLOCK * 2 * 32 * 4  # layers x (K, V) x tokens x kv heads x dim x fp32


def build_model(path: Path) -> None:
    """A seeded random Llama: 2 layers, head size 32 (vLLM's CPU attention needs >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {}
    if cfg.get("extra_config") is not None:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "engine_id": cfg["engine_id"],
            "kv_connector_extra_config": cfg["extra_config"],
        }
    llm = LLM(
        model=cfg["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=GPU_BLOCK,
        kv_cache_memory_bytes=NUM_GPU_BLOCKS * PAGE_BYTES,
        num_gpu_blocks_override=NUM_GPU_BLOCKS,
        max_model_len=384,
        max_num_seqs=4,
        enable_prefix_caching=True,
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        **kwargs,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
    outputs = []
    for step in cfg["steps"]:
        if "generate" in step:
            out = llm.generate(
                [TokensPrompt(prompt_token_ids=step["generate"])], params, use_tqdm=False
            )[0]
            outputs.append(
                {"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens}
            )
        elif "scribble_region" in step:
            path = Path(cfg["shm_dir"]) / f"kvtier-vllm-{cfg['engine_id']}.slab"
            data = np.memmap(path, dtype=np.uint8, mode="r+")
            slabs = len(data) // (PAGE_BYTES + 1) * PAGE_BYTES  # not the status bytes after
            rng = np.random.default_rng(step["scribble_region"])
            data[:slabs] = rng.integers(0, 256, size=slabs, dtype=np.uint8)
            data.flush()
            del data
    counters = {}
    for metric in llm.get_metrics():
        if metric.name in (
            "vllm:prefix_cache_hits",
            "vllm:external_prefix_cache_hits",
            "vllm:external_prefix_cache_queries",
            "vllm:kv_offload_load_bytes",
            "vllm:kv_offload_store_bytes",
        ):
            counters[metric.name] = counters.get(metric.name, 0) + int(metric.value)
    print("RESULT " + json.dumps({"outputs": outputs, "counters": counters}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--build-model":
        build_model(Path(sys.argv[2]))
    else:
        main(sys.argv[1])
