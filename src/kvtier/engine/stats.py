"""Statistics of one ``generate`` call: per request, and for the whole call.

Pure values, built by the engine at the end of ``generate`` (``LLM.last_stats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.engine.connector_api import OffloadStats


@dataclass(frozen=True, slots=True)
class RequestStats:
    """What happened to one request in a ``generate`` call.

    Hits are those of the request's first admission (the ones that set its TTFT).

    Attributes:
        request_id: the engine's id of the request.
        prompt_tokens: tokens in the prompt.
        output_tokens: tokens generated.
        gpu_hit_blocks: blocks served by the GPU prefix cache.
        external_hit_blocks: blocks the connector reported offloaded (tried to load).
        loaded_blocks: of those, blocks loaded successfully.
        computed_tokens: prompt tokens run through the model, over all admissions
            (a recompute after a preemption counts again; decoded tokens do not).
        preemptions: times the request lost its pages and was recomputed.
        ttft_s: seconds from the ``generate`` call to the request's first token.
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    gpu_hit_blocks: int
    external_hit_blocks: int
    loaded_blocks: int
    computed_tokens: int
    preemptions: int
    ttft_s: float


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One ``generate`` call.

    Attributes:
        requests: per request, in prompt order.
        block_size: tokens per GPU page (to turn block counts into tokens).
        wall_s: seconds the call took, from entry to the last token.
        offload: what the connector moved (zeros without offloading).
    """

    requests: tuple[RequestStats, ...]
    block_size: int
    wall_s: float
    offload: OffloadStats = field(default_factory=OffloadStats)

    @property
    def gpu_hit_blocks(self) -> int:
        """Blocks served by the GPU prefix cache, over all requests."""
        return sum(r.gpu_hit_blocks for r in self.requests)

    @property
    def gpu_hit_tokens(self) -> int:
        """Tokens served by the GPU prefix cache, over all requests."""
        return self.gpu_hit_blocks * self.block_size

    @property
    def loaded_tokens(self) -> int:
        """Tokens loaded by the connector instead of computed, over all requests."""
        return sum(r.loaded_blocks for r in self.requests) * self.block_size

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def ttft_s(self) -> tuple[float, ...]:
        """Time to first token of each request, in prompt order."""
        return tuple(r.ttft_s for r in self.requests)
