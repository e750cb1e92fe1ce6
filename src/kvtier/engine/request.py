"""A generation request as the engine tracks it.

Runs in the engine's scheduler; pure Python. ``Request`` is the engine's own mutable
record; connectors receive it and must treat it as read-only. Where it is in its
lifecycle is which of the scheduler's queues holds it::

    waiting ──admit──► loading ──loads done──► running ──max_new_tokens──► finished
       ▲          └────(no external hits)───────►  │                     (held while
       └──────────────── preempt (out of pages) ───┘                      stores read it)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.blocks import BlockHash, BlockId
from kvtier.engine.connector_api import LoadHandle
from kvtier.engine.stats import RequestStats


@dataclass(eq=False, slots=True)
class Request:
    """One prompt being served. Owned by the scheduler; read-only to connectors.

    Attributes:
        request_id: unique within the engine.
        prompt_token_ids: the prompt.
        max_new_tokens: generation stops after this many tokens (no EOS stop: greedy).
        arrival_s: ``time.perf_counter()`` at submission.
        output_token_ids: tokens generated so far.
        block_table: its pages, in token order (empty unless admitted).
        block_keys: keys of its full blocks (of ``all_token_ids``), computed at admission.
        num_computed_tokens: tokens whose KV is in its pages.
        num_committed_blocks: leading pages already named by key in the prefix cache.
        prefill_end: ``num_tokens`` at admission: tokens before it are prefill work.
        load: the pending external load, while ``LOADING``.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[BlockId] = field(default_factory=list)
    block_keys: list[BlockHash] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_committed_blocks: int = 0
    prefill_end: int = 0
    load: LoadHandle | None = None
    # statistics
    first_token_s: float | None = None
    admissions: int = 0
    gpu_hit_blocks: int = 0
    external_hit_blocks: int = 0
    loaded_blocks: int = 0
    computed_tokens: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return len(self.output_token_ids) >= self.max_new_tokens

    def stats(self, start_s: float) -> RequestStats:
        """This request's statistics, with TTFT measured from ``start_s``."""
        first = self.first_token_s if self.first_token_s is not None else float("nan")
        return RequestStats(
            request_id=self.request_id,
            prompt_tokens=len(self.prompt_token_ids),
            output_tokens=len(self.output_token_ids),
            gpu_hit_blocks=self.gpu_hit_blocks,
            external_hit_blocks=self.external_hit_blocks,
            loaded_blocks=self.loaded_blocks,
            computed_tokens=self.computed_tokens,
            preemptions=max(0, self.admissions - 1),
            ttft_s=first - start_s,
        )
