"""``WorkerProcess``: the worker half in a child process, driven over a pipe.

Runs in the engine's process (this class) and in a child it spawns (``_serve``). The
child builds its own ``OffloadingSpec`` from the same configuration and geometry, and
its own handlers over the engine's KV cache tensors, which it receives once at start
(CPU tensors through shared memory, CUDA tensors through CUDA IPC: torch's
multiprocessing). After that only values cross the pipe::

    engine process                               child process
    ──────────────                               ─────────────
    submit(jobs)   ── Submit(TransferJob, ...) ──►  ConnectorWorker.submit
    get_finished() ◄─ Finished(TransferResult, ..) ─ pushed as jobs finish
    wait(ids)      ── Wait(ids, n) ──────────────►  wait, then Finished(...), Waited(n)
    shutdown()     ── Shutdown() ────────────────►  finish, Finished(...), Closed()

A real engine (vLLM) runs its workers this way: the scheduler half never touches a
tensor, and nothing is shared but these values.

Waiting is the one blocking call, and a stop signal may end it (``kvtier.interrupts``):
each message is received and taken in a ``critical`` section, so none is lost between
the two, and each ``Wait`` carries a number its ``Waited`` echoes, so the reply of a
wait cut short never ends a later one early.

A child that dies (killed, out of memory) never takes the engine down: every job it
had not reported, and every later one, comes back failed, so loads are recomputed and
stores are dropped, as for any failed job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from kvtier.config import OffloadingConfig
from kvtier.errors import KvtierError
from kvtier.interrupts import critical
from kvtier.jobs import TransferJob, TransferResult

if TYPE_CHECKING:
    import torch

    from kvtier.offloading_spec import KVGeometry

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.001
"""How long the child waits for a message before it looks for finished jobs again."""

_START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Submit:
    jobs: tuple[TransferJob, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_ids: tuple[int, ...]
    seq: int  # echoed in ``Waited``: the reply of a wait cut short is told apart


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class Finished:
    results: tuple[TransferResult, ...]


@dataclass(frozen=True, slots=True)
class Waited:
    seq: int


@dataclass(frozen=True, slots=True)
class Ready:
    pass


@dataclass(frozen=True, slots=True)
class Closed:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


class WorkerProcess:
    """A ``WorkerHalf`` whose handlers run in a spawned child process.

    Args:
        config: the offloading configuration (the child validates nothing new).
        geometry: the engine's KV geometry.
        kv_caches: the engine's KV cache tensors; CPU tensors are moved into shared
            memory in place (the engine keeps using the same tensor objects).

    Raises:
        KvtierError: the child could not build its handlers (the message says why).
    """

    def __init__(
        self,
        config: OffloadingConfig,
        geometry: KVGeometry,
        kv_caches: Sequence[torch.Tensor],
    ) -> None:
        import torch.multiprocessing as mp

        for tensor in kv_caches:
            if tensor.device.type == "cpu":
                tensor.share_memory_()  # type: ignore[no-untyped-call]
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, config, geometry, list(kv_caches)),
            name="kvtier-worker",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._results: list[TransferResult] = []
        self._pending: set[int] = set()  # submitted, not yet reported
        self._dead: str | None = None  # why the child is gone
        self._closed = False
        self._waits = 0  # the number of the last ``Wait`` sent
        if not self._conn.poll(_START_TIMEOUT_S):
            self._kill()
            raise KvtierError(f"the worker process did not start in {_START_TIMEOUT_S:.0f} s")
        first = self._conn.recv()
        if isinstance(first, Failed):
            self._proc.join()
            raise KvtierError(f"the worker process failed to start: {first.error}")

    def submit(self, jobs: Sequence[TransferJob]) -> None:
        if not jobs:
            return
        self._pending.update(job.job_id for job in jobs)
        self._send(Submit(tuple(jobs)))

    def get_finished(self) -> list[TransferResult]:
        try:
            while self._dead is None and self._conn.poll():
                with critical:
                    self._take(self._conn.recv())
        except (EOFError, OSError) as exc:
            self._died(exc)
        results, self._results = self._results, []
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        self._waits += 1
        seq = self._waits
        self._send(Wait(tuple(job_ids), seq))
        self._receive_until(lambda m: isinstance(m, Waited) and m.seq == seq)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._send(Shutdown())
        self._receive_until(lambda m: isinstance(m, Closed))
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._kill()
        self._conn.close()

    def _send(self, message: object) -> None:
        if self._dead is None:
            try:
                self._conn.send(message)
            except (EOFError, OSError) as exc:
                self._died(exc)
        else:  # a dead child reports every later job failed at once
            self._died(None)

    def _receive_until(self, last: Callable[[object], bool]) -> None:
        """Take messages until one is ``last`` (or the child is gone). Waiting for each
        is outside a ``critical`` section, so a stop signal can end it; receiving and
        taking it are inside, so none is lost between the two."""
        try:
            while self._dead is None:
                self._conn.poll(None)
                with critical:
                    message = self._take(self._conn.recv())
                if last(message):
                    return
        except (EOFError, OSError) as exc:
            self._died(exc)

    def _take(self, message: object) -> object:
        if isinstance(message, Finished):
            self._results.extend(message.results)
            self._pending.difference_update(r.job_id for r in message.results)
        return message

    def _died(self, exc: BaseException | None) -> None:
        """The child is gone: every job it did not report has failed."""
        if self._dead is None:
            self._dead = f"the worker process died (exit code {self._proc.exitcode}): {exc!r}"
            logger.error("%s; its %d job(s) in flight fail", self._dead, len(self._pending))
        self._results.extend(TransferResult.failed(j, self._dead) for j in sorted(self._pending))
        self._pending.clear()

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.join()


def _serve(
    conn: Connection,
    config: OffloadingConfig,
    geometry: KVGeometry,
    kv_caches: list[torch.Tensor],
) -> None:
    """The child's loop: build the worker half, then serve messages until Shutdown."""
    from kvtier.connector.worker_half import ConnectorWorker
    from kvtier.offloading_spec import OffloadingSpec

    try:
        worker = ConnectorWorker.from_spec(OffloadingSpec(config, geometry), kv_caches)
    except Exception as exc:
        conn.send(Failed(f"{type(exc).__name__}: {exc}"))
        return
    conn.send(Ready())
    while True:
        if conn.poll(_IDLE_POLL_S):
            message = conn.recv()
            if isinstance(message, Submit):
                worker.submit(message.jobs)
            elif isinstance(message, Wait):
                worker.wait(message.job_ids)
                conn.send(Finished(tuple(worker.get_finished())))
                conn.send(Waited(message.seq))
            elif isinstance(message, Shutdown):
                worker.shutdown()
                conn.send(Finished(tuple(worker.get_finished())))
                conn.send(Closed())
                return
        done = worker.get_finished()
        if done:
            conn.send(Finished(tuple(done)))
