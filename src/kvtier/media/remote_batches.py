"""The batches of a ``RemoteLoop``: what a caller submits (``Op``), how it ended
(``BatchResult``), and the loop's own mutable records of a batch and of each of its
values in flight.

Runs in the loop's thread (``Batch`` and ``Value`` are touched by it only); imports no
torch.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvtier.media.remote_values import ReadOutcome

logger = logging.getLogger("kvtier.media.remote")


class Op(str, enum.Enum):
    STORE = "store"
    LOAD = "load"
    DELETE = "delete"
    """Remove the values (a batch without pages: give ``[]``). The loop queues one
    itself for the values a load found corrupt."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """How one batch ended.

    Attributes:
        error: why the batch failed as a whole (unhealthy store, a lost connection,
            values refused by the server); ``None`` if every value was answered.
        outcomes: a load's outcome per value (all ``MISS`` when ``error`` is set and
            the value was never verified); empty for a store.
        seconds: from the batch's start in the loop to its end.
    """

    error: str | None
    outcomes: tuple[ReadOutcome, ...]
    seconds: float


@dataclass(eq=False, slots=True)
class Batch:
    """A batch in the loop (mutable; touched by the loop's thread only)."""

    op: Op
    keys: list[bytes]
    names: list[bytes]
    pages: list[np.ndarray]
    on_done: Callable[[BatchResult], None]
    outcomes: list[ReadOutcome] = field(default_factory=list)
    left: int = 0
    error: str | None = None
    refused: list[str] = field(default_factory=list)
    started: float = 0.0


@dataclass(eq=False, slots=True)
class Value:
    """One value of a batch, in flight on a connection (or waiting for one)."""

    batch: Batch
    index: int
    header: bytearray | None = None  # a load's header, read from its reply
    stored: np.ndarray | None = None  # where its payload lands (its page, unless sealed)
    crlf: bytearray | None = None  # and the CRLF that ends it
    outcome: ReadOutcome = ReadOutcome.MISS


def report(batch: Batch) -> None:
    """Call ``batch.on_done`` with how it ended (an exception it raises is logged)."""
    outcomes = tuple(batch.outcomes) if batch.op is Op.LOAD else ()
    result = BatchResult(batch.error, outcomes, time.perf_counter() - batch.started)
    try:
        batch.on_done(result)
    except Exception:
        logger.exception("a remote batch's on_done raised")
