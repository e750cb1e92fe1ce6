"""``Discovery``: asks a shared store which keys it holds, off the scheduler's thread.

Runs in the scheduler process; pure Python. A shared tier (remote) holds blocks other
engines wrote, which this engine's index does not know. Finding them takes a network
round trip (``exists_many``), and a slow or hung server must never hold up an engine
step, so ``lookup`` never waits for one::

    step n:    lookup ─► miss past the known run ─► ask(keys)  ──► I/O thread
                                                                   exists_many(keys)
    step n+k:  lookup ─► answers() ─► adopt the found run  ◄────── done

Until an answer is adopted those blocks are misses. At most ``max_in_flight`` checks
wait or run at once; a later ask is dropped (counted), so a hung server costs one
blocked I/O thread and nothing else. A caller that could wait for answers
(``asking``) does not wait on a store that is *stalled* (a check unanswered for
``stall_s``) or *failing* (an outage since the last check it answered, e.g. a server
found down or hung when the store was opened): a fresh engine's first request costs
no more with a hung server than any later one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from kvtier.blocks import BlockHash
from kvtier.errors import KvtierError

logger = logging.getLogger(__name__)


class SharedStore(Protocol):
    """What the tiering asks of a store that other engines write to (remote)."""

    def exists_many(self, keys: Sequence[bytes]) -> Sequence[bool]:
        """Which keys the store holds (one batched check; may raise ``KvtierError``)."""
        ...

    @property
    def outages(self) -> int:
        """How many outages the store has had: after one, its contents may be gone."""
        ...


@dataclass(frozen=True, slots=True)
class Found:
    """An answer: the leading ``keys`` the store held, asked after ``outages`` outages;
    ``answered``: the store answered (False: the check failed, ``keys`` is empty)."""

    keys: tuple[BlockHash, ...]
    outages: int
    answered: bool = True


class Discovery:
    """Existence checks against one shared store, on one background thread.

    Args:
        store: the shared store.
        max_in_flight: most checks queued or running at once.
        stall_s: a check unanswered this long marks the store stalled.
    """

    def __init__(self, store: SharedStore, max_in_flight: int = 4, stall_s: float = 0.1) -> None:
        self.store = store
        self.max_in_flight = max_in_flight
        self.stall_s = stall_s
        self._asked_at: dict[BlockHash, float] = {}
        self.dropped = 0  # asks not made because too many were in flight
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-discovery")
        self._futures: dict[BlockHash, Future[Found]] = {}  # first key asked -> check
        self._answered_after = 0  # the store's outages when its latest answer was asked

    def ask(self, keys: Sequence[BlockHash]) -> None:
        """Start a check of ``keys`` (a run from its first key); never waits."""
        if not keys or keys[0] in self._futures:
            return
        if len(self._futures) >= self.max_in_flight:
            self.dropped += 1
            return
        asked = tuple(keys)
        self._futures[asked[0]] = self._pool.submit(self._check, asked, self.store.outages)
        self._asked_at[asked[0]] = time.monotonic()

    def answers(self) -> list[Found]:
        """The answers of finished checks since the last call (failed checks: none)."""
        done = [k for k, f in self._futures.items() if f.done()]
        found = []
        for first in done:
            self._asked_at.pop(first, None)
            result = self._futures.pop(first).result()
            if result.answered:
                self._answered_after = max(self._answered_after, result.outages)
            if result.keys:
                found.append(result)
        return found

    def asking(self, first: BlockHash) -> bool:
        """Whether a check of the run from ``first`` is in flight or not yet adopted,
        and worth waiting for (``False`` while the store is stalled or failing)."""
        return first in self._futures and not self.stalled and not self.failing

    @property
    def failing(self) -> bool:
        """Whether the store has had an outage since the last check it answered (down
        or hung, from its start or since): its answers are not waited for until it
        answers again."""
        return self.store.outages > self._answered_after

    @property
    def stalled(self) -> bool:
        """Whether a check has gone unanswered for ``stall_s`` (a slow or hung store)."""
        oldest = time.monotonic() - self.stall_s
        return any(at < oldest and not self._futures[k].done() for k, at in self._asked_at.items())

    @property
    def in_flight(self) -> int:
        """Checks queued or running (finished ones wait in ``answers``)."""
        return sum(not f.done() for f in self._futures.values())

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the checks in flight have finished (for flushes and tests)."""
        wait(list(self._futures.values()), timeout=timeout_s)

    def shutdown(self) -> None:
        """Stop taking checks; a running one ends within the store's timeout."""
        for future in self._futures.values():
            future.cancel()
        self._pool.shutdown(wait=True)
        self._futures.clear()
        self._asked_at.clear()

    def _check(self, keys: tuple[BlockHash, ...], outages: int) -> Found:
        try:
            exists = self.store.exists_many(keys)
        except KvtierError:
            return Found((), outages, answered=False)  # unreachable or unhealthy: no hits
        except Exception:  # a bug, but it must not take the engine down
            logger.exception("shared-store existence check raised")
            return Found((), outages, answered=False)
        run = next((i for i, hit in enumerate(exists) if not hit), len(exists))
        return Found(keys[:run], outages)
