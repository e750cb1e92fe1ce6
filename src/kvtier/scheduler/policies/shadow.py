"""``ShadowTier``: one eviction policy over keys only, served requests as a tier is.

Runs in the scheduler; pure Python. The ``leader`` policy runs each of its candidate
policies, unchanged, as a shadow of the tier: a tier without slots, bytes, pins or
events, holding only the set of its keys. ``serve.serve_request`` serves it a request
with the calls an engine makes of the real tier, answered as ``TierManager`` answers
them: the prefix hit is counted, every resident key is used (the first key last), the
missing keys are stored (evicting, but never the store's own keys), and the request is
used again (recency only for the keys just stored).

Two differences from the manager:

* Nothing in a shadow is ever held (stores complete at once, nothing is loaded), so
  eviction asks no one and a completed store releases nothing (there is nothing to).
* When nothing was stored, the request's second use is skipped: it would make the
  same moves again. For LRU, ARC, branch and density those change nothing; for SLRU
  they can promote again blocks that the first use demoted, when one request's
  resident keys overflow its protected list. A hit -- the usual request -- costs one
  touch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import filterfalse, takewhile

from kvtier.blocks import BlockHash
from kvtier.scheduler.policies.base import EvictionPolicy

_NONE_STORING: frozenset[BlockHash] = frozenset()


def _never_held(key: BlockHash) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class ShadowStore:
    """What a shadow's ``prepare_store`` did: the keys stored and those evicted."""

    block_hashes_to_store: list[BlockHash]
    block_hashes_evicted: list[BlockHash]


class ShadowTier:
    """A policy of ``capacity`` blocks over keys only (see the module docstring).

    Attributes:
        policy: the candidate policy, an instance of its class.
        resident: the keys the shadow holds.
        hits: prefix-hit blocks counted by ``lookup`` (the caller resets it).
        learns: whether the policy learns from ``observe`` (shown every request).
        last: what the last request's store did (``None``: it stored nothing).
    """

    __slots__ = ("_storing", "_touched", "capacity", "hits", "last", "learns", "policy", "resident")

    def __init__(self, cls: type[EvictionPolicy], capacity: int) -> None:
        self.capacity = capacity
        self.policy = cls(capacity)
        self.resident: set[BlockHash] = set()
        self.hits = 0
        self.learns = cls.observe is not EvictionPolicy.observe
        self.last: ShadowStore | None = None
        self._storing: frozenset[BlockHash] | set[BlockHash] = _NONE_STORING
        self._touched = False  # the request has been used once since its lookup

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        if self.learns:
            self.policy.observe(block_hashes)
        resident = self.resident
        if resident.issuperset(block_hashes):  # the usual case at a hit: all resident
            hit = len(block_hashes)
        else:
            hit = len(list(takewhile(resident.__contains__, block_hashes)))
        self.hits += hit
        self.last = None
        self._touched = False
        return hit

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        storing = self._storing
        if self._touched and not storing:  # the same moves again (module docstring)
            return
        self._touched = True
        used = list(filter(self.resident.__contains__, reversed(block_hashes)))
        if used:
            self.policy.touch_all(used, storing)

    def hit_all(self, block_hashes: Sequence[BlockHash], backwards: Sequence[BlockHash]) -> None:
        """Serve a request all of whose keys the shadow holds, as ``serve_request``
        would (``backwards``: the keys reversed), without asking which it holds."""
        if self.learns:
            self.policy.observe(block_hashes)
        self.hits += len(block_hashes)
        self.last = None
        self.policy.touch_all(backwards, _NONE_STORING)

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> ShadowStore | None:
        resident, policy = self.resident, self.policy
        to_store = list(filterfalse(resident.__contains__, dict.fromkeys(block_hashes)))
        if not to_store or len(to_store) > self.capacity:
            return None
        victims: list[BlockHash] = []
        need = len(resident) + len(to_store) - self.capacity
        if need > 0:
            chosen = policy.choose_victims(need, _never_held, set(block_hashes), to_store)
            if chosen is None:
                return None
            policy.evict(chosen)
            resident.difference_update(chosen)
            victims = chosen
        policy.add_all(to_store)
        resident.update(to_store)
        self._storing = set(to_store)
        self.last = ShadowStore(to_store, victims)
        return self.last

    def complete_store(self, block_hashes: Sequence[BlockHash]) -> None:
        """The stored keys are ready: nothing was held, so nothing is released."""
        self._storing = _NONE_STORING
