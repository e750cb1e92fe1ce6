"""Jobs and their results: the values that cross between the connector's two halves.

Runs anywhere; pure Python, no torch. The scheduler half decides and emits
``TransferJob`` values; the worker half submits them to its handlers and answers with
``TransferResult`` values. Nothing else crosses, so the halves can live in different
processes (every value here pickles)::

    scheduler half ──(TransferJob: id, kind, src spec, dst spec)──► worker half
                   ◄──────(TransferResult: id, success, bytes, time)──

A job's ``kind`` is bookkeeping for the scheduler half (what to complete when it
finishes); the worker routes by the specs' media alone. Deletes travel inside store
jobs (``KeyedBlocksSpec.evicted_hashes``), ordered before the write they make room for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvtier.specs import LoadStoreSpec

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
"""``(src_spec, dst_spec)`` of one job."""


class JobKind(enum.Enum):
    """Why the scheduler half made a job (the worker does not look at it)."""

    LOAD = "load"  # CPU -> GPU pages of a request
    STORE = "store"  # GPU pages -> CPU
    PROMOTE = "promote"  # a secondary tier -> CPU, before a load
    WRITE = "write"  # CPU -> a secondary tier (write-through)


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One asynchronous copy, as the scheduler half hands it to the worker half.

    Attributes:
        job_id: unique among the jobs in flight of one connector.
        kind: what the job is for.
        src: where the blocks are read.
        dst: where they are written.
    """

    job_id: int
    kind: JobKind
    src: LoadStoreSpec
    dst: LoadStoreSpec

    @property
    def spec(self) -> TransferSpec:
        """``(src, dst)``, as handlers take it."""
        return (self.src, self.dst)


@dataclass(frozen=True, slots=True)
class TransferResult:
    """The outcome of one job.

    Attributes:
        job_id: the id given to ``transfer_async``.
        success: whether every byte of the job reached its destination.
        bytes_moved: bytes copied (0 for a failed job).
        seconds: time the copy took on its stream or thread (0.0 when it never ran).
        error: why the job failed; ``None`` on success.
    """

    job_id: int
    success: bool
    bytes_moved: int
    seconds: float
    error: str | None = None

    @classmethod
    def failed(cls, job_id: int, error: str) -> TransferResult:
        """A failed result that moved nothing."""
        return cls(job_id=job_id, success=False, bytes_moved=0, seconds=0.0, error=error)
