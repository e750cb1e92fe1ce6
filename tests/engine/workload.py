"""The chat workload of the offloading tests (shared by their modules and conftest)."""

from __future__ import annotations

import random

GPU_BLOCKS = 40
PAGE = 4


def chats(seed: int = 0, convs: int = 4, turns: int = 3) -> list[list[int]]:
    """Interleaved turns of conversations that share a system prompt; each turn
    resends its conversation's history (fixed fake answers keep prompts known)."""
    rng = random.Random(seed)
    system = [rng.randrange(512) for _ in range(37)]
    histories = [list(system) for _ in range(convs)]
    prompts = []
    for _ in range(turns):
        for h in histories:
            h.extend(rng.randrange(512) for _ in range(rng.randint(9, 30)))
            prompts.append(list(h))
            h.extend(rng.randrange(512) for _ in range(4))
    return prompts
