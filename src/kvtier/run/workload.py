"""The multi-turn chat workload of ``kvtier run``: planned up front, filled in as it runs.

Runs in the ``kvtier run`` process; pure Python (no torch). A seeded plan fixes every
token the user sends and the length of every answer; the answers themselves come from
the engine, so each turn's prompt is the history the engine really computed::

    prompt(conv c, turn t) = system prompt
                             + user(c, 0) + answer(c, 0) + ... + user(c, t-1) + answer(c, t-1)
                             + user(c, t)

Turns are interleaved round-robin (conv 0 turn 0, conv 1 turn 0, ..., conv 0 turn 1,
...), so with a GPU pool too small for every conversation, a conversation's history has
left the GPU by the time its next turn comes: it is recomputed, or loaded back from an
offloaded tier. Prompt lengths depend only on the plan, never on the answers' content.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvtier.errors import ConfigError, ProtocolError


def _check_range(option: str, value: tuple[int, int], low: int) -> None:
    lo, hi = value
    if not low <= lo <= hi:
        raise ConfigError(option, f"needs {low} <= MIN <= MAX, got {lo}-{hi}")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The shape of the chat workload (the ``kvtier run`` options of the same names).

    Attributes:
        conversations: conversations, all sharing one system prompt.
        turns: turns per conversation.
        system_tokens: tokens of the shared system prompt.
        user_tokens: (min, max) tokens of each new user message, drawn uniformly.
        answer_tokens: (min, max) tokens generated per turn, drawn uniformly.
        seed: seeds every token id and length.

    Raises:
        ConfigError: a value is out of range (the key is the option's name).
    """

    conversations: int = 4
    turns: int = 9
    system_tokens: int = 256
    user_tokens: tuple[int, int] = (100, 300)
    answer_tokens: tuple[int, int] = (16, 32)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.conversations < 1:
            raise ConfigError("--conversations", f"must be >= 1, got {self.conversations}")
        if self.turns < 1:
            raise ConfigError("--turns", f"must be >= 1, got {self.turns}")
        if self.system_tokens < 0:
            raise ConfigError("--system-tokens", f"must be >= 0, got {self.system_tokens}")
        _check_range("--user-tokens", self.user_tokens, 1)
        _check_range("--answer-tokens", self.answer_tokens, 1)


@dataclass(frozen=True, slots=True)
class Turn:
    """One planned turn.

    Attributes:
        conversation: which conversation (0-based).
        index: the turn's index in its conversation (0-based).
        user_token_ids: the new user message.
        answer_tokens: tokens to generate.
        history_tokens: tokens before the new message (system prompt + earlier turns).
    """

    conversation: int
    index: int
    user_token_ids: tuple[int, ...]
    answer_tokens: int
    history_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """Tokens sent: the history plus the new user message."""
        return self.history_tokens + len(self.user_token_ids)


@dataclass(frozen=True, slots=True)
class Workload:
    """A planned workload: the system prompt and every turn, in the order they run.

    Attributes:
        spec: what it was generated from.
        vocab_size: token ids are drawn from ``[0, vocab_size)``.
        system_token_ids: the system prompt every conversation starts with.
        turns: all turns, interleaved round-robin across conversations.
    """

    spec: WorkloadSpec
    vocab_size: int
    system_token_ids: tuple[int, ...]
    turns: tuple[Turn, ...]

    @property
    def max_request_tokens(self) -> int:
        """Prompt plus answer of the largest turn: what the GPU pool must hold at once."""
        return max(t.prompt_tokens + t.answer_tokens for t in self.turns)

    def final_history_tokens(self) -> list[int]:
        """Per conversation, its tokens after its last turn (system prompt included)."""
        last = {t.conversation: t for t in self.turns}
        return [
            last[c].prompt_tokens + last[c].answer_tokens for c in range(self.spec.conversations)
        ]

    def distinct_tokens(self) -> int:
        """Tokens whose KV the workload computes once each (the system prompt counted once)."""
        system = len(self.system_token_ids)
        return system + sum(n - system for n in self.final_history_tokens())


def generate_workload(spec: WorkloadSpec, vocab_size: int) -> Workload:
    """Plan the workload: the same ``spec`` and ``vocab_size`` give the same plan.

    Raises:
        ConfigError: ``vocab_size`` is below 1.
    """
    if vocab_size < 1:
        raise ConfigError("model", f"vocabulary size must be >= 1, got {vocab_size}")
    rng = random.Random(spec.seed)
    system = tuple(rng.randrange(vocab_size) for _ in range(spec.system_tokens))
    history = [len(system)] * spec.conversations
    turns = []
    for index in range(spec.turns):
        for conv in range(spec.conversations):
            user = tuple(rng.randrange(vocab_size) for _ in range(rng.randint(*spec.user_tokens)))
            answer = rng.randint(*spec.answer_tokens)
            turns.append(Turn(conv, index, user, answer, history[conv]))
            history[conv] += len(user) + answer
    return Workload(spec, vocab_size, system, tuple(turns))


class Chat:
    """The conversations' histories as a run fills them in (one ``Chat`` per engine).

    Args:
        workload: the plan.
    """

    __slots__ = ("_history", "_workload")

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self._history: list[list[int]] = [
            list(workload.system_token_ids) for _ in range(workload.spec.conversations)
        ]

    def prompt(self, turn: Turn) -> list[int]:
        """The token ids to send for ``turn``: its conversation's history plus the message.

        Raises:
            ProtocolError: turns are run out of order (the history has the wrong length).
        """
        history = self._history[turn.conversation]
        if len(history) != turn.history_tokens:
            raise ProtocolError(
                f"Chat.prompt: conversation {turn.conversation} turn {turn.index} out of order "
                f"(history has {len(history)} tokens, the plan says {turn.history_tokens})",
            )
        return history + list(turn.user_token_ids)

    def record(self, turn: Turn, answer: list[int]) -> None:
        """Append the turn's message and the engine's ``answer`` to the history.

        Raises:
            ProtocolError: the answer's length is not the planned one.
        """
        if len(answer) != turn.answer_tokens:
            raise ProtocolError(
                f"Chat.record: answer of conversation {turn.conversation} turn {turn.index} has "
                f"{len(answer)} tokens, planned {turn.answer_tokens}",
            )
        self._history[turn.conversation] += list(turn.user_token_ids) + list(answer)
