"""Spatially sampled shadow caches: which requests a shadow sees, and at what size.

Runs in the scheduler; pure Python. A policy that learns from keys-only *shadow*
caches (``adaptive``, ``leader``) need not feed them every request: SHARDS
(Waldspurger et al., FAST'15) shows that a cache of ``capacity / R`` fed the
references whose key hashes to 0 mod ``R`` has nearly the hit ratio of the full
cache on the full traffic. Here a whole request is sampled or not, by its first key,
so a sampled shadow sees whole prefixes (requests that share a first block share
their fate)::

    sample_rate(capacity) = R     the largest power of two <= capacity / SAMPLED_SHADOW_BLOCKS
                                  (at most MAX_RATE); 1 (no sampling) below FULL_SHADOWS_BELOW
    is_sampled(keys, R - 1)       crc32(keys[0]) % R == 0

Sampling by a CRC-32 of the first key is uniform for kvtier's SHA-256 keys and for
trace ids (little-endian integers).
"""

from __future__ import annotations

from collections.abc import Sequence
from zlib import crc32

from kvtier.blocks import BlockHash

FULL_SHADOWS_BELOW = 65536
"""Tiers smaller than this run full-size shadows; larger ones sample requests."""

SAMPLED_SHADOW_BLOCKS = 8192
"""Keys a sampled shadow holds at least."""

MAX_RATE = 256
"""At most 1 request in this many is sampled."""


def sample_rate(capacity: int) -> int:
    """``R``: shadows of a tier of ``capacity`` blocks see 1 request in ``R`` (a power
    of two) and hold ``capacity // R`` keys."""
    rate = 1
    if capacity >= FULL_SHADOWS_BELOW:
        while rate < MAX_RATE and capacity // (2 * rate) >= SAMPLED_SHADOW_BLOCKS:
            rate *= 2
    return rate


def is_sampled(keys: Sequence[BlockHash], mask: int) -> bool:
    """Whether a request of ``keys`` (not empty) is sampled at rate ``mask + 1``
    (always at rate 1, without hashing)."""
    return not mask or not crc32(keys[0]) & mask
