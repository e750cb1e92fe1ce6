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
    wait(ids)      ── Wait(ids) ─────────────────►  wait, then Finished(...), Waited()
    shutdown()     ── Shutdown() ────────────────►  finish, Finished(...), Closed()

A real engine (vLLM) runs its workers this way: the scheduler half never touches a
tensor, and nothing is shared but these values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from kvtier.config import OffloadingConfig
from kvtier.errors import KvtierError
from kvtier.jobs import TransferJob, TransferResult

if TYPE_CHECKING:
    import torch

    from kvtier.spec import KVGeometry

_IDLE_POLL_S = 0.001
"""How long the child waits for a message before it looks for finished jobs again."""

_START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Submit:
    jobs: tuple[TransferJob, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class Finished:
    results: tuple[TransferResult, ...]


@dataclass(frozen=True, slots=True)
class Waited:
    pass


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
        self._closed = False
        if not self._conn.poll(_START_TIMEOUT_S):
            self._kill()
            raise KvtierError(f"the worker process did not start in {_START_TIMEOUT_S:.0f} s")
        first = self._conn.recv()
        if isinstance(first, Failed):
            self._proc.join()
            raise KvtierError(f"the worker process failed to start: {first.error}")

    def submit(self, jobs: Sequence[TransferJob]) -> None:
        if jobs:
            self._conn.send(Submit(tuple(jobs)))

    def get_finished(self) -> list[TransferResult]:
        while self._conn.poll():
            self._take(self._conn.recv())
        results, self._results = self._results, []
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        self._conn.send(Wait(tuple(job_ids)))
        while not isinstance(self._take(self._conn.recv()), Waited):
            pass

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.send(Shutdown())
        while not isinstance(self._take(self._conn.recv()), Closed):
            pass
        self._proc.join(timeout=30)
        self._conn.close()

    def _take(self, message: object) -> object:
        if isinstance(message, Finished):
            self._results.extend(message.results)
        return message

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
    from kvtier.spec import OffloadingSpec

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
                conn.send(Waited())
            elif isinstance(message, Shutdown):
                worker.shutdown()
                conn.send(Finished(tuple(worker.get_finished())))
                conn.send(Closed())
                return
        done = worker.get_finished()
        if done:
            conn.send(Finished(tuple(done)))
