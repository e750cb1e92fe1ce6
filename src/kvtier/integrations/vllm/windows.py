"""``WindowChecks``: which of a windowed group's blocks Redis holds, every one of them.

Runs in vLLM's scheduler process; pure Python. A windowed KV cache group (sliding
window, chunked local attention, Mamba state) needs only the blocks of its window
before a hit's end, and vLLM stores only those: the blocks still in the window when it
stores a request's new blocks. In Redis such a group's blocks are therefore sparse --
a window here and there along the prompt -- and vLLM looks them up from the right.
The tiering's discovery (``kvtier.scheduler.discovery``) asks about a request's
blocks as a run from its first unknown block and adopts the run's leading blocks, the
shape of a full-attention group's blocks; for a windowed group it would stop at the
first block outside a window and never find the windows after it.

So the manager asks about a windowed group's blocks once per request, all of them,
through ``WindowChecks``: one batched existence check (``exists_many``) on a background
thread, every block found adopted into the Redis tier's index (unless the store had an
outage since the check was asked: its contents may be gone). Until the check answers,
the group's lookups of blocks no tier knows answer ``RETRY``; after, ``MISS`` or a
promotion as for any block.

A group is windowed, for the manager, when vLLM's first lookup of it in a request is
past where vLLM's own cache stopped (``RequestKeys.admit``): vLLM looks a
full-attention group up from there, a windowed one from the hit's end.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from kvtier.blocks import BlockHash
from kvtier.errors import KvtierError
from kvtier.scheduler.discovery import SharedStore
from kvtier.scheduler.manager import TierManager

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16
"""Checks queued or running at once; a later one is not asked (its lookups miss)."""


class WindowChecks:
    """Existence checks of windowed groups' blocks against one shared store.

    Args:
        store: the shared store (every rank's Redis store as one).
        tier: the Redis tier's index, which adopts what the checks find.
    """

    def __init__(self, store: SharedStore, tier: TierManager) -> None:
        self.store = store
        self.tier = tier
        self.dropped = 0  # checks not asked: too many in flight
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-windows")
        self._checks: dict[Hashable, Future[tuple[list[BlockHash], int]]] = {}

    def ask(self, token: Hashable, keys: Sequence[BlockHash]) -> bool:
        """Start a check of ``keys`` under ``token`` (one request's group); never waits.
        Returns whether it was asked."""
        if not keys or token in self._checks:
            return False
        if len(self._checks) >= MAX_IN_FLIGHT:
            self.dropped += 1
            return False
        self._checks[token] = self._pool.submit(self._check, list(keys), self.store.outages)
        return True

    def asking(self, token: Hashable) -> bool:
        """Whether the check under ``token`` is still running (adopt answers first)."""
        check = self._checks.get(token)
        return check is not None and not check.done()

    def adopt(self) -> None:
        """Adopt what finished checks found into the tier (no outage since asked)."""
        for token in [t for t, check in self._checks.items() if check.done()]:
            found, outages = self._checks.pop(token).result()
            if found and outages == self.store.outages:
                self.tier.adopt(found)

    @property
    def in_flight(self) -> int:
        return sum(not check.done() for check in self._checks.values())

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the checks in flight have finished (for tests)."""
        wait(list(self._checks.values()), timeout=timeout_s)

    def shutdown(self) -> None:
        for check in self._checks.values():
            check.cancel()
        self._pool.shutdown(wait=True)
        self._checks.clear()

    def _check(self, keys: list[BlockHash], outages: int) -> tuple[list[BlockHash], int]:
        try:
            held = self.store.exists_many(keys)
        except KvtierError:
            return [], outages  # unreachable or unhealthy: no hits from it now
        except Exception:  # a bug, but it must not take the engine down
            logger.exception("kvtier: existence check of windowed blocks raised")
            return [], outages
        return [k for k, h in zip(keys, held, strict=True) if h], outages
