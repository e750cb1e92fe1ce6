"""The soak's workload: seeded conversations, answered by a reference engine.

Runs in the soak process. Conversations share a system prompt; each turn sends the
conversation's history plus a new user message. The answer that goes into the
history is the reference engine's (no offloading), so every prompt is known before
any engine under test answers it, and a wrong token there cannot change what is
asked next. A conversation that reached its last turn starts over as a new one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Reference(Protocol):
    """What answers the workload's prompts: an engine without offloading (``LLM``, or
    a vLLM server without the connector)."""

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[list[int]]: ...


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: the prompt, and the tokens a correct engine generates."""

    conversation: int
    prompt: tuple[int, ...]
    expected: tuple[int, ...]


@dataclass(slots=True)
class _Conversation:
    history: list[int] = field(default_factory=list)
    turns: int = 0


class Conversations:
    """``slots`` conversations at a time, ``turns`` turns each, then a fresh one.

    Args:
        reference: an engine without offloading over the same model (a large GPU pool:
            it keeps the histories' prefixes, so it computes only what is new).
        vocab: token ids are drawn from ``0 .. vocab - 1``.
        seed: seeds every token drawn.
    """

    def __init__(
        self,
        reference: Reference,
        vocab: int,
        seed: int,
        slots: int = 8,
        turns: int = 6,
        system_tokens: int = 64,
        user_tokens: tuple[int, int] = (16, 64),
        answer_tokens: int = 8,
    ) -> None:
        self.reference = reference
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.turns = turns
        self.user_tokens = user_tokens
        self.answer_tokens = answer_tokens
        self.system = self._draw(system_tokens)
        self.slots = [_Conversation(list(self.system)) for _ in range(slots)]
        self.started = slots

    def _draw(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def next_turn(self) -> Turn:
        """The next request of a random conversation, with its reference answer."""
        i = self.rng.randrange(len(self.slots))
        conv = self.slots[i]
        if conv.turns == self.turns:
            conv = self.slots[i] = _Conversation(list(self.system))
            self.started += 1
        prompt = conv.history + self._draw(self.rng.randint(*self.user_tokens))
        expected = self.reference.generate([prompt], max_new_tokens=self.answer_tokens)[0]
        conv.history = prompt + expected
        conv.turns += 1
        return Turn(conversation=i, prompt=tuple(prompt), expected=tuple(expected))
