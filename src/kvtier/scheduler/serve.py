"""``serve_request``: one request served as an engine serves it, every store instant.

Runs in the scheduler; pure Python. The engine's flow for a request (the connector
looks the prompt up, stores what it computed, and the request's blocks end up the most
recent), with every store completing at once and no load in flight::

    hit = lookup(keys)                          # longest run of ready blocks from the first
    touch(keys)                                 # the resident blocks are used again
    out = prepare_store(keys[hit:])             # store the rest, evicting other blocks
    touch(keys)                                 # the whole request most recent, key 0 first
    complete_store(out.block_hashes_to_store)   # if out is not None

``kvtier simulate`` replays a trace so through the real ``TierManager``; the ``leader``
and ``adaptive`` policies serve their shadows' requests so (``policies/shadow.py``,
``policies/adaptive.py``: keys-only tiers with the same four calls); the tests serve
their managers so. Each tier answers the calls by its own rules; the order of the
calls is this function's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.blocks import BlockHash


class StorePlan(Protocol):
    """What ``prepare_store`` returns: the keys it is storing (``PrepareStoreOutput``)."""

    @property
    def block_hashes_to_store(self) -> Sequence[BlockHash]: ...


class ServesRequests(Protocol):
    """The calls a request makes of a tier (``OffloadingManager``'s, without loads)."""

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int: ...

    def touch(self, block_hashes: Sequence[BlockHash]) -> None: ...

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> StorePlan | None: ...

    def complete_store(self, block_hashes: Sequence[BlockHash]) -> None: ...


def serve_request(tier: ServesRequests, keys: Sequence[BlockHash]) -> int:
    """Serve one request of ``keys`` (its whole prefix, in order); return its prefix hit.

    Look the keys up, use the resident ones, store the rest (the store's own keys are
    never evicted for it), use the whole request again (recency only for the blocks
    being stored), and complete the store at once.
    """
    hit = tier.lookup(keys)
    tier.touch(keys)
    out = tier.prepare_store(keys[hit:])
    tier.touch(keys)
    if out is not None:
        tier.complete_store(out.block_hashes_to_store)
    return hit
