"""Hit ratios of a replay, and the counter that accumulates them.

Three ratios, which differ by up to 20 points on real traces, so every report names
which one it shows:

* **block hit ratio** = Σ hit / Σ len(keys) -- the share of block references served
  from the offload tiers (long prompts weigh more);
* **token hit ratio** = Σ min(block_size·hit, input_length) / Σ input_length -- the
  share of prompt tokens not recomputed (a partial last block counts its real size);
* **request hit ratio (mean)** = mean over requests of hit / len(keys) -- the typical
  request's saving (every request weighs the same; requests with no blocks are left
  out of the mean).

``hit`` is the prefix hit of one request: the longest run of blocks, from the first,
that a lookup found ready.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HitRatios:
    """Hit ratios of one replay (see the module docstring for the definitions).

    Attributes:
        block_hit_ratio: Σ hit / Σ len(keys).
        token_hit_ratio: Σ min(block_size·hit, input_length) / Σ input_length.
        request_hit_ratio_mean: mean over requests of hit / len(keys).
        requests: requests replayed.
        block_refs: Σ len(keys).
        hit_blocks: Σ hit.
        tokens: Σ input_length.
        hit_tokens: Σ min(block_size·hit, input_length).
    """

    block_hit_ratio: float
    token_hit_ratio: float
    request_hit_ratio_mean: float
    requests: int
    block_refs: int
    hit_blocks: int
    tokens: int
    hit_tokens: int


class HitCounter:
    """Accumulates per-request prefix hits into :class:`HitRatios`.

    Args:
        block_size: tokens per block, to turn hit blocks into hit tokens.
    """

    __slots__ = (
        "_block_refs",
        "_block_size",
        "_hit_blocks",
        "_hit_tokens",
        "_ratio_sum",
        "_requests",
        "_scored_requests",
        "_tokens",
    )

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._requests = 0
        self._scored_requests = 0
        self._block_refs = 0
        self._hit_blocks = 0
        self._tokens = 0
        self._hit_tokens = 0
        self._ratio_sum = 0.0

    def add(self, hit: int, num_blocks: int, input_length: int) -> None:
        """Count one request that hit ``hit`` of its ``num_blocks`` blocks."""
        self._requests += 1
        self._block_refs += num_blocks
        self._hit_blocks += hit
        self._tokens += input_length
        self._hit_tokens += min(self._block_size * hit, input_length)
        if num_blocks:
            self._scored_requests += 1
            self._ratio_sum += hit / num_blocks

    def ratios(self) -> HitRatios:
        """The ratios so far (0.0 for an empty denominator)."""
        return HitRatios(
            block_hit_ratio=_ratio(self._hit_blocks, self._block_refs),
            token_hit_ratio=_ratio(self._hit_tokens, self._tokens),
            request_hit_ratio_mean=_ratio(self._ratio_sum, self._scored_requests),
            requests=self._requests,
            block_refs=self._block_refs,
            hit_blocks=self._hit_blocks,
            tokens=self._tokens,
            hit_tokens=self._hit_tokens,
        )


def _ratio(numerator: float, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0
