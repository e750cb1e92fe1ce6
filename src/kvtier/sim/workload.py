"""A seeded workload generator: chats on shared system prompts, documents, and agents.

Runs anywhere (pure Python, ``random.Random(seed)``: the same seed gives the same
trace on every machine). It makes Mooncake-format traces whose prefix structure is
known, to tune and check policies beyond the one published synthetic trace:

* **chats**: each conversation starts from one of a few shared system prompts (Zipf
  popularity) and adds turns; turn ``k`` re-sends the whole history, so its prompt
  extends turn ``k-1``'s. Conversations interleave (several are open at once).
* **documents**: one-off long prompts (a pasted document plus a question), each never
  seen again -- or, with ``doc_requery_p``, asked about a second time later.

* **agents**: sessions that start from one of a few long shared tool prompts (Zipf
  popularity) and loop: each step appends a tool call and its output and re-sends the
  whole history, for many steps.

``shape`` picks the mix: ``mixed`` (chats and documents, the default), ``chat``,
``documents`` or ``agents`` (see :func:`shaped`).

Block ids are prefix-chained as in Mooncake: a block's id is determined by its parent
id and its own content, so equal prefixes share ids and nothing else does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from kvtier.sim.trace import DEFAULT_BLOCK_SIZE, Trace, trace_from_requests


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Shape of a generated workload (defaults: a small mixed chat/document load).

    Attributes:
        seed: seed of the random generator.
        requests: requests to generate.
        system_prompts: distinct shared system prompts.
        system_prompt_blocks: blocks per system prompt.
        zipf_s: Zipf exponent of system-prompt popularity.
        open_chats: conversations open at once.
        turn_blocks: (min, max) new blocks per turn (user message plus last answer).
        max_turns: turns after which a conversation ends.
        doc_share: share of requests that are documents.
        doc_blocks: (min, max) blocks per document.
        doc_requery_p: chance that a document is asked about again later.
        block_size: tokens per block.
        mean_gap_ms: mean time between arrivals (exponential).
        agent_share: share of requests that are agent steps.
        tool_prompts: distinct shared tool prompts of agents.
        tool_prompt_blocks: (min, max) blocks per tool prompt.
        open_agents: agent sessions open at once.
        step_blocks: (min, max) new blocks per agent step (call plus tool output).
        max_steps: (min, max) steps of one agent session.
    """

    seed: int = 0
    requests: int = 4000
    system_prompts: int = 20
    system_prompt_blocks: int = 4
    zipf_s: float = 1.1
    open_chats: int = 64
    turn_blocks: tuple[int, int] = (1, 4)
    max_turns: int = 12
    doc_share: float = 0.3
    doc_blocks: tuple[int, int] = (16, 96)
    doc_requery_p: float = 0.3
    block_size: int = DEFAULT_BLOCK_SIZE
    mean_gap_ms: float = 50.0
    agent_share: float = 0.0
    tool_prompts: int = 6
    tool_prompt_blocks: tuple[int, int] = (12, 40)
    open_agents: int = 24
    step_blocks: tuple[int, int] = (1, 6)
    max_steps: tuple[int, int] = (4, 30)


SHAPES = ("mixed", "chat", "documents", "agents")
"""Workload shapes :func:`shaped` knows."""


def shaped(shape: str, seed: int, *, block_size: int = DEFAULT_BLOCK_SIZE) -> WorkloadConfig:
    """The configuration of a named workload shape.

    * ``mixed``: 70 % chat turns, 30 % documents (the defaults);
    * ``chat``: chat turns only;
    * ``documents``: documents only, half of them asked about again later;
    * ``agents``: 85 % agent steps on long shared tool prompts, 15 % chat turns.

    Raises:
        ValueError: an unknown shape.
    """
    base = WorkloadConfig(seed=seed, block_size=block_size)
    if shape == "mixed":
        return base
    if shape == "chat":
        return replace(base, doc_share=0.0)
    if shape == "documents":
        return replace(base, doc_share=1.0, doc_requery_p=0.5)
    if shape == "agents":
        return replace(base, doc_share=0.0, agent_share=0.85)
    raise ValueError(f"unknown workload shape {shape!r}; choose one of {', '.join(SHAPES)}")


class _Ids:
    """Prefix-chained block ids: ``(parent, content) -> id``, dense from 0."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int], int] = {}
        self._fresh = 0

    def child(self, parent: int, content: int) -> int:
        key = (parent, content)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found

    def extend(self, prefix: list[int], blocks: int) -> list[int]:
        """``prefix`` plus ``blocks`` blocks of content never used before."""
        out = list(prefix)
        parent = out[-1] if out else -1
        for _ in range(blocks):
            self._fresh += 1
            parent = self.child(parent, self._fresh)
            out.append(parent)
        return out


def generate(config: WorkloadConfig | None = None) -> Trace:
    """Generate a trace (deterministic for a given ``config``)."""
    cfg = config or WorkloadConfig()
    rng = random.Random(cfg.seed)
    ids = _Ids()
    prompts = [ids.extend([], cfg.system_prompt_blocks) for _ in range(cfg.system_prompts)]
    weights = [1.0 / (rank + 1) ** cfg.zipf_s for rank in range(cfg.system_prompts)]
    tools = [  # none without agents: a shape without them draws no random numbers here
        ids.extend([], rng.randint(*cfg.tool_prompt_blocks))
        for _ in range(cfg.tool_prompts if cfg.agent_share else 0)
    ]
    tool_weights = [1.0 / (rank + 1) ** cfg.zipf_s for rank in range(cfg.tool_prompts)]
    chats: list[tuple[list[int], int]] = []  # (history, turns so far)
    agents: list[tuple[list[int], int]] = []  # (history, steps left)
    requery: list[list[int]] = []  # documents waiting for a second question
    rows: list[tuple[float, int, int, list[int]]] = []
    now = 0.0
    bs = cfg.block_size
    for _ in range(cfg.requests):
        now += rng.expovariate(1.0 / cfg.mean_gap_ms)
        if cfg.agent_share and rng.random() < cfg.agent_share:
            while len(agents) < cfg.open_agents:
                agents.append((rng.choices(tools, tool_weights)[0], rng.randint(*cfg.max_steps)))
            slot = rng.randrange(len(agents))
            history, left = agents[slot]
            blocks = ids.extend(history, rng.randint(*cfg.step_blocks))
            if left <= 1:
                agents.pop(slot)
            else:
                agents[slot] = (blocks, left - 1)
        elif rng.random() < cfg.doc_share:
            if requery and rng.random() < 0.5:
                doc = requery.pop(rng.randrange(len(requery)))
                blocks = ids.extend(doc, 1)  # the same document, a new question
            else:
                doc = ids.extend([], rng.randint(*cfg.doc_blocks))
                if rng.random() < cfg.doc_requery_p:
                    requery.append(doc)
                blocks = ids.extend(doc, 1)
        else:
            while len(chats) < cfg.open_chats:
                prompt = rng.choices(prompts, weights)[0]
                chats.append((prompt, 0))
            slot = rng.randrange(len(chats))
            history, turns = chats[slot]
            blocks = ids.extend(history, rng.randint(*cfg.turn_blocks))
            if turns + 1 >= cfg.max_turns:
                chats.pop(slot)
            else:
                chats[slot] = (blocks, turns + 1)
        tokens = len(blocks) * bs - rng.randrange(bs)  # a partial last block
        rows.append((round(now), tokens, rng.randint(1, 512), blocks))
    source = f"generated(seed={cfg.seed}, requests={cfg.requests}{_shape_note(cfg)})"
    return trace_from_requests(rows, block_size=bs, source=source)


def _shape_note(cfg: WorkloadConfig) -> str:
    if cfg.agent_share:
        return ", agents"
    if cfg.doc_share == 0:
        return ", chat"
    if cfg.doc_share == 1:
        return ", documents"
    return ""
