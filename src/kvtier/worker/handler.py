"""The handler protocol, its result type, and the worker that routes jobs to handlers.

Runs in the worker process, in the engine's thread. A *job* is a job id plus a
transfer spec ``(src_spec, dst_spec)``. Every job given to ``transfer_async`` comes
back exactly once from ``get_finished``, successful or not: a refused job, an invalid
spec, a copy that raised, a medium pair nobody handles all become a failed
``TransferResult`` with an ``error`` that says why. Nothing a job does raises out of
the worker, so a bad transfer costs a recompute, never the engine.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable

from kvtier.blocks import Medium
from kvtier.errors import ProtocolError, TransferSpecError
from kvtier.jobs import TransferResult, TransferSpec
from kvtier.load_store_specs import LoadStoreSpec

logger = logging.getLogger(__name__)

__all__ = ["OffloadingHandler", "OffloadingWorker", "TransferResult", "TransferSpec", "spec_media"]


class OffloadingHandler(abc.ABC):
    """Moves bytes for one ``(src medium, dst medium)`` pair, asynchronously.

    Contract (checked by ``tests/worker/test_handler_contract.py`` for every handler):

    * ``transfer_async`` returns without waiting for the copy. It returns ``True``
      when the job was accepted and ``False`` when it was refused (invalid spec,
      handler shut down); either way the job is reported once by ``get_finished``.
    * Jobs finish in submission order: ``get_finished`` never reports a job before
      one submitted earlier.
    * ``get_finished`` and ``wait`` do not raise for anything a job did.
    """

    @abc.abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Submit a job; never blocks on the copy itself."""

    @abc.abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order; never blocks."""

    @abc.abstractmethod
    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs have finished (unknown or reported ids: no wait)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Finish the queued jobs, then refuse new ones. Idempotent.

        Results of finished jobs stay available from ``get_finished``.
        """


def spec_media(spec: TransferSpec) -> tuple[Medium, Medium]:
    """The ``(src, dst)`` media of a transfer spec.

    Raises:
        TransferSpecError: ``spec`` is not a ``(LoadStoreSpec, LoadStoreSpec)`` pair.
    """
    if not (
        isinstance(spec, tuple)
        and len(spec) == 2
        and all(isinstance(s, LoadStoreSpec) for s in spec)
    ):
        raise TransferSpecError(f"a transfer spec is (src spec, dst spec), got {spec!r:.80}")
    src, dst = spec
    return src.medium, dst.medium


class OffloadingWorker:
    """Routes each job to the handler registered for its ``(src, dst)`` media.

    Runs in the engine's worker thread; it is not itself thread-safe (one caller).
    A job for an unregistered pair, or one whose handler raises or refuses, is
    reported failed by the next ``get_finished``; the worker keeps going.
    """

    def __init__(self) -> None:
        self._handlers: dict[tuple[Medium, Medium], OffloadingHandler] = {}
        self._pending: dict[int, OffloadingHandler] = {}
        self._failed: list[TransferResult] = []

    def register_handler(self, src: Medium, dst: Medium, handler: OffloadingHandler) -> None:
        """Send jobs from ``src`` to ``dst`` to ``handler``.

        Raises:
            ProtocolError: when the pair already has a handler.
        """
        key = (Medium(src), Medium(dst))
        if key in self._handlers:
            raise ProtocolError(f"a handler for {key[0]}->{key[1]} is already registered")
        self._handlers[key] = handler

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Submit a job to its handler.

        Returns:
            True when a handler accepted it; False otherwise, in which case the next
            ``get_finished`` reports it failed.

        Raises:
            ProtocolError: when ``job_id`` is already in flight (a caller bug).
        """
        if job_id in self._pending or any(r.job_id == job_id for r in self._failed):
            raise ProtocolError(f"job {job_id} is already in flight")
        try:
            src, dst = spec_media(spec)
        except TransferSpecError as exc:
            self._failed.append(TransferResult.failed(job_id, f"invalid transfer spec: {exc}"))
            return False
        handler = self._handlers.get((src, dst))
        if handler is None:
            known = ", ".join(f"{s}->{d}" for s, d in self._handlers) or "none"
            self._failed.append(
                TransferResult.failed(job_id, f"no handler for {src}->{dst} (registered: {known})")
            )
            return False
        try:
            accepted = handler.transfer_async(job_id, spec)
        except Exception as exc:
            logger.exception("handler for %s->%s raised on job %d", src, dst, job_id)
            self._failed.append(TransferResult.failed(job_id, f"handler raised: {exc!r}"))
            return False
        # Accepted or refused, the handler reports the job; keep its route until then.
        self._pending[job_id] = handler
        return bool(accepted)

    def get_finished(self) -> list[TransferResult]:
        """Every job finished since the last call: failures of routing first, then each
        handler's results in its submission order."""
        results, self._failed = self._failed, []
        for handler in {id(h): h for h in self._handlers.values()}.values():
            try:
                done = handler.get_finished()
            except Exception as exc:
                logger.exception("handler %r raised in get_finished", handler)
                done = [
                    TransferResult.failed(j, f"handler raised in get_finished: {exc!r}")
                    for j, h in self._pending.items()
                    if h is handler
                ]
            for result in done:
                if self._pending.pop(result.job_id, None) is not None:
                    results.append(result)
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs have finished; never raises for a job's failure."""
        by_handler: dict[int, tuple[OffloadingHandler, list[int]]] = {}
        for job_id in job_ids:
            handler = self._pending.get(job_id)
            if handler is not None:
                by_handler.setdefault(id(handler), (handler, []))[1].append(job_id)
        for handler, ids in by_handler.values():
            try:
                handler.wait(ids)
            except Exception:
                logger.exception("handler %r raised in wait", handler)

    def shutdown(self) -> None:
        """Shut every handler down (each finishes its queued jobs first)."""
        for handler in {id(h): h for h in self._handlers.values()}.values():
            try:
                handler.shutdown()
            except Exception:
                logger.exception("handler %r raised in shutdown", handler)
