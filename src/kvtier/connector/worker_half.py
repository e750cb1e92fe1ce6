"""``ConnectorWorker``: the connector's worker half. Imports torch (through the handlers).

Runs where the KV cache lives: in the engine's process for the reference engine, or
in a process of its own (``WorkerProcess``), one per GPU in a real engine. It takes
only ``TransferJob`` values, submits each to the handler registered for its media, and
reports finished jobs as ``TransferResult`` values. It decides nothing: which blocks
move, where, and what a result means are the scheduler half's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from kvtier.jobs import TransferJob, TransferResult

if TYPE_CHECKING:
    import torch

    from kvtier.spec import OffloadingSpec
    from kvtier.worker import OffloadingWorker


class WorkerHalf(Protocol):
    """What the engine's side needs of a worker half, wherever it runs."""

    def submit(self, jobs: Sequence[TransferJob]) -> None:
        """Start the jobs; never waits for a copy."""
        ...

    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call; never blocks."""
        ...

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until these jobs have finished (their results come from
        ``get_finished``)."""
        ...

    def shutdown(self) -> None:
        """Finish the jobs in flight, then release handlers, memory and stores."""
        ...


class ConnectorWorker:
    """The worker half over an ``OffloadingWorker`` (handlers routed by media).

    Args:
        worker: the router with every handler registered.
        spec: the spec that built it (shut down with it), if any.
    """

    def __init__(self, worker: OffloadingWorker, spec: OffloadingSpec | None = None) -> None:
        self.worker = worker
        self._spec = spec

    @classmethod
    def from_spec(cls, spec: OffloadingSpec, kv_caches: Sequence[torch.Tensor]) -> ConnectorWorker:
        """The worker half of ``spec`` over the engine's KV cache tensors."""
        return cls(spec.get_worker(kv_caches), spec)

    def submit(self, jobs: Sequence[TransferJob]) -> None:
        for job in jobs:
            self.worker.transfer_async(job.job_id, job.spec)  # a refusal comes back failed

    def get_finished(self) -> list[TransferResult]:
        return self.worker.get_finished()

    def wait(self, job_ids: Iterable[int]) -> None:
        self.worker.wait(job_ids)

    def shutdown(self) -> None:
        if self._spec is not None:
            self._spec.shutdown()
        else:
            self.worker.shutdown()
