"""The runner of ``kvtier run``: the workload through one engine per configuration.

Runs in the ``kvtier run`` process, on the model's device. Every configuration gets a
fresh ``LLM`` over the same model instance (same weights) with the same GPU pool. The
engines run side by side, turn by turn (turn 1 on every engine, then turn 2, ...), so a
machine that slows down mid-run slows every configuration alike. Each turn is one
``generate`` call with one prompt, so its TTFT is the turn's alone.

Each engine feeds its own answers back into its own conversations; offloading must not
change a single token, which ``compare_outputs`` checks.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from transformers import PreTrainedModel

from kvtier.engine import LLM, OffloadStats
from kvtier.run.configs import Configuration
from kvtier.run.workload import Chat, Turn, Workload

if TYPE_CHECKING:
    from kvtier.observability.exporter import LabeledRegistries

_WARMUP_TOKENS = 4


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn on one engine.

    Attributes:
        conversation: the turn's conversation.
        turn: the turn's index in its conversation.
        prompt_tokens: tokens sent.
        history_tokens: of those, the history before the new user message.
        ttft_s: time to first token.
        gpu_hit_tokens: prompt tokens served by the GPU prefix cache.
        offload_hit_tokens: prompt tokens found offloaded, per tier (``"CPU"``, ``"DISK"``).
        loaded_blocks: GPU pages loaded from an offloaded tier.
        computed_tokens: prompt tokens run through the model.
        output: the generated tokens.
    """

    conversation: int
    turn: int
    prompt_tokens: int
    history_tokens: int
    ttft_s: float
    gpu_hit_tokens: int
    offload_hit_tokens: Mapping[str, int]
    loaded_blocks: int
    computed_tokens: int
    output: tuple[int, ...]

    @property
    def output_digest(self) -> str:
        """A short SHA-256 of the output tokens (to compare runs without the tokens)."""
        data = b"".join(t.to_bytes(8, "little") for t in self.output)
        return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ConfigRun:
    """The workload on one configuration.

    Attributes:
        config: the configuration.
        turns: per turn, in the order they ran.
        totals: what the connector moved.
        wall_s: seconds spent in this configuration's ``generate`` calls.
    """

    config: Configuration
    turns: tuple[TurnResult, ...] = ()
    totals: OffloadStats = field(default_factory=OffloadStats)
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A turn whose output differs from the baseline configuration's.

    Attributes:
        config: the configuration that differs.
        baseline: the configuration compared against (the first that ran).
        conversation, turn: which turn.
        position: index of the first differing output token.
    """

    config: str
    baseline: str
    conversation: int
    turn: int
    position: int


def compare_outputs(runs: Sequence[ConfigRun]) -> tuple[Mismatch, ...]:
    """Every turn whose output differs from the first run's."""
    ran = list(runs)
    if not ran:
        return ()
    base = ran[0]
    out = []
    for run in ran[1:]:
        for mine, ref in zip(run.turns, base.turns, strict=True):
            if mine.output != ref.output:
                pairs = zip(mine.output, ref.output, strict=False)
                shorter = min(len(mine.output), len(ref.output))
                pos = next((i for i, (a, b) in enumerate(pairs) if a != b), shorter)
                out.append(
                    Mismatch(run.config.name, base.config.name, ref.conversation, ref.turn, pos)
                )
    return tuple(out)


def _turn_result(turn: Turn, llm: LLM, output: list[int], offload_block_size: int) -> TurnResult:
    stats = llm.last_stats
    assert stats is not None and len(stats.requests) == 1
    req = stats.requests[0]
    hits = {str(m): n * offload_block_size for m, n in stats.offload.hit_blocks.items() if n}
    return TurnResult(
        conversation=turn.conversation,
        turn=turn.index,
        prompt_tokens=req.prompt_tokens,
        history_tokens=turn.history_tokens,
        ttft_s=req.ttft_s,
        gpu_hit_tokens=req.gpu_hit_blocks * stats.block_size,
        offload_hit_tokens=hits,
        loaded_blocks=req.loaded_blocks,
        computed_tokens=req.computed_tokens,
        output=tuple(output),
    )


def run_job(
    model: PreTrainedModel,
    workload: Workload,
    configs: Sequence[Configuration],
    gpu_blocks: int,
    block_size: int,
    progress: TextIO | None = sys.stderr,
    metrics: LabeledRegistries | None = None,
) -> tuple[ConfigRun, ...]:
    """Run ``workload`` on every configuration, side by side, turn by turn.

    Args:
        model: the model every engine shares (its weights are only read).
        workload: the planned turns.
        configs: the configurations.
        gpu_blocks: pages in each engine's GPU pool.
        block_size: tokens per page.
        progress: where to write one line per turn (``None``: silent).
        metrics: where each engine's metrics registry is added, labelled with its
            configuration's name (``None``: not served).

    Raises:
        ConfigError: an engine rejects its configuration (the key names what to change).
        CapacityError: the largest turn does not fit in ``gpu_blocks`` pages.
    """
    engines: list[LLM] = []
    try:
        for config in configs:
            llm = LLM(model, gpu_blocks, block_size, offload=config.offload)
            if metrics is not None and llm.metrics is not None:
                metrics.add(config.name, llm.metrics.registry)
            engines.append(llm)
        return _run_turns(workload, configs, engines, progress)
    finally:
        for llm in engines:
            llm.close()


def _run_turns(
    workload: Workload,
    configs: Sequence[Configuration],
    engines: Sequence[LLM],
    progress: TextIO | None,
) -> tuple[ConfigRun, ...]:
    warm = random.Random(0)
    for llm in engines:  # first calls pay one-time costs; too short to fill a page
        prompt = [warm.randrange(workload.vocab_size) for _ in range(_WARMUP_TOKENS)]
        llm.generate([prompt], max_new_tokens=1)
    chats = [Chat(workload) for _ in configs]
    results: list[list[TurnResult]] = [[] for _ in configs]
    totals = [OffloadStats() for _ in configs]
    walls = [0.0 for _ in configs]
    for step, turn in enumerate(workload.turns, 1):
        cells = []
        for i, (config, llm) in enumerate(zip(configs, engines, strict=True)):
            prompt = chats[i].prompt(turn)
            start = time.perf_counter()
            output = llm.generate([prompt], max_new_tokens=turn.answer_tokens)[0]
            walls[i] += time.perf_counter() - start
            chats[i].record(turn, output)
            offload_block = int((config.offload or {}).get("block_size", llm.pool.block_size))
            result = _turn_result(turn, llm, output, offload_block)
            assert llm.last_stats is not None
            totals[i] = totals[i] + llm.last_stats.offload
            results[i].append(result)
            cells.append(_cell(config.name, result))
        if progress is not None:
            print(
                f"[{step:>3}/{len(workload.turns)}] conv {turn.conversation} turn {turn.index} "
                f"{turn.prompt_tokens:>5} tok | " + " | ".join(cells),
                file=progress,
                flush=True,
            )
    return tuple(
        ConfigRun(config, tuple(results[i]), totals[i], walls[i])
        for i, config in enumerate(configs)
    )


def _cell(name: str, result: TurnResult) -> str:
    hits = f"gpu {result.gpu_hit_tokens}"
    for tier, n in sorted(result.offload_hit_tokens.items()):
        hits += f" {tier.lower()} {n}"
    return f"{name} {result.ttft_s:6.2f}s ({hits})"
