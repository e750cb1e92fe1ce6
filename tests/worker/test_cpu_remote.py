"""CPU<->remote handlers against a real redis-server: round trips, per-job failures
(misses, corruption, a dead Redis), FIFO completion, and never raising."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, RemoteLoadStoreSpec
from kvtier.media import remote_values
from kvtier.media.circuit_breaker import Backoff, CircuitBreaker
from kvtier.media.remote import RemoteOptions, RemoteStore
from kvtier.media.remote_loop import BatchResult, Op
from kvtier.worker import cpu_remote
from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec

from ..fake_clock import Clock
from ..forking import run_in_forked_child
from ..media.test_remote_loop import ScriptedRedis
from ..redis_server import RedisServer

FP = b"\x66" * 32
BLOCK = 16 * 1024
NUM = 16


def key(i: int) -> BlockHash:
    return BlockHash(bytes([i]) * 32)


def store_spec(rows: list[int], keys: list[int]) -> TransferSpec:
    ids = tuple(BlockId(r) for r in rows)
    return CPULoadStoreSpec(ids), RemoteLoadStoreSpec(ids, tuple(key(k) for k in keys))


def load_spec(keys: list[int], rows: list[int]) -> TransferSpec:
    cpu, remote = store_spec(rows, keys)
    return remote, cpu


def run(handler: OffloadingHandler, jobs: dict[int, TransferSpec]) -> dict[int, TransferResult]:
    for job_id, spec in jobs.items():
        handler.transfer_async(job_id, spec)
    handler.wait(list(jobs))
    results = handler.get_finished()
    assert [r.job_id for r in results] == list(jobs)
    assert handler.get_finished() == []
    return {r.job_id: r for r in results}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pages() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (NUM, BLOCK), dtype=torch.uint8, generator=gen)


@pytest.fixture
def handlers(
    server: RedisServer, clock: Clock, pages: torch.Tensor
) -> Iterator[CpuRemoteOffloadingHandlers]:
    breaker = CircuitBreaker(Backoff(base_s=1.0, max_s=4.0, jitter=0.0), clock=clock)
    options = RemoteOptions(url=server.url, timeout_s=0.5)
    store = RemoteStore.open(FP, options, breaker=breaker, environ={})
    h = CpuRemoteOffloadingHandlers(pages, store, io_threads=2)
    h.store = store  # type: ignore[attr-defined]
    yield h
    h.shutdown()
    store.close()


def test_round_trip(handlers: CpuRemoteOffloadingHandlers, pages: torch.Tensor) -> None:
    original = pages.clone()
    stored = run(
        handlers.cpu_to_remote_handler,
        {1: store_spec([0, 1, 2], [0, 1, 2]), 2: store_spec([3, 4], [3, 4])},
    )
    assert all(r.success and r.error is None for r in stored.values())
    assert stored[1].bytes_moved == 3 * BLOCK and stored[2].bytes_moved == 2 * BLOCK
    pages.zero_()
    loaded = run(handlers.remote_to_cpu_handler, {3: load_spec([4, 0, 2], [10, 11, 12])})
    assert loaded[3].success and loaded[3].bytes_moved == 3 * BLOCK
    for src, dst in ((4, 10), (0, 11), (2, 12)):
        assert torch.equal(pages[dst], original[src])


def test_many_jobs_finish_in_submission_order(
    handlers: CpuRemoteOffloadingHandlers, pages: torch.Tensor
) -> None:
    jobs = {j: store_spec([j % NUM], [j]) for j in range(60)}
    assert all(r.success for r in run(handlers.cpu_to_remote_handler, jobs).values())
    loads = {100 + j: load_spec([j], [j % NUM]) for j in range(0, 60, 3)}
    loads[1000] = load_spec([200], [0])  # a miss, in the middle of the order
    loads[1001] = load_spec([3], [1])
    results = run(handlers.remote_to_cpu_handler, loads)
    assert [r.success for r in results.values()] == [True] * 20 + [False, True]
    assert "missed" in (results[1000].error or "")


def test_missed_block_fails_the_job_and_is_zeroed(
    handlers: CpuRemoteOffloadingHandlers, pages: torch.Tensor
) -> None:
    original = pages.clone()
    run(handlers.cpu_to_remote_handler, {1: store_spec([0], [0])})
    (result,) = run(handlers.remote_to_cpu_handler, {2: load_spec([0, 77], [5, 6])}).values()
    assert (result.success, result.bytes_moved) == (False, 0)
    assert "1 of 2 block(s) not loaded" in (result.error or "")
    assert torch.equal(pages[5], original[0]) and not pages[6].any()


def test_corrupted_value_fails_the_load_zeroes_the_page_and_is_deleted(
    handlers: CpuRemoteOffloadingHandlers, server: RedisServer, pages: torch.Tensor
) -> None:
    run(handlers.cpu_to_remote_handler, {1: store_spec([0, 1], [0, 1])})
    store: RemoteStore = handlers.store  # type: ignore[attr-defined]
    server.cli("SETRANGE", store.redis_key(key(1)).decode(), "5000", "corrupted")
    (result,) = run(handlers.remote_to_cpu_handler, {2: load_spec([0, 1], [8, 9])}).values()
    assert not result.success and "failed verification" in (result.error or "")
    assert not pages[9].any()
    assert store.exists_many([key(0), key(1)]) == [True, False]


def test_killed_redis_fails_jobs_without_raising_then_recovers(
    handlers: CpuRemoteOffloadingHandlers,
    server: RedisServer,
    clock: Clock,
    pages: torch.Tensor,
) -> None:
    store: RemoteStore = handlers.store  # type: ignore[attr-defined]
    run(handlers.cpu_to_remote_handler, {1: store_spec([0], [0])})
    for j in range(2, 12):  # in flight while Redis dies: each succeeds or fails
        handlers.cpu_to_remote_handler.transfer_async(j, store_spec([j], [j]))
    server.kill()
    handlers.cpu_to_remote_handler.transfer_async(12, store_spec([12], [12]))
    handlers.cpu_to_remote_handler.wait(range(2, 13))
    results = handlers.cpu_to_remote_handler.get_finished()
    assert [r.job_id for r in results] == list(range(2, 13))
    assert not results[-1].success and not store.healthy
    pages[3].fill_(9)
    down = run(handlers.remote_to_cpu_handler, {20: load_spec([0], [3])})
    assert not down[20].success and "unhealthy" in (down[20].error or "")
    assert not pages[3].any()  # a failed load leaves no plausible bytes
    server.start()  # same port, empty
    clock.now += 10.0  # past the backoff: the next job is the probe
    assert run(handlers.cpu_to_remote_handler, {30: store_spec([5], [5])})[30].success
    assert store.healthy
    assert run(handlers.remote_to_cpu_handler, {31: load_spec([5], [6])})[31].success
    assert torch.equal(pages[6], pages[5])


@pytest.mark.parametrize(
    ("direction", "spec", "why"),
    [
        ("store", (CPULoadStoreSpec((BlockId(0),)), DiskLoadStoreSpec((BlockId(0),), ())), "takes"),
        ("store", store_spec([0, 1], [0]), "CPU blocks for"),
        ("store", store_spec([NUM], [0]), "outside"),
        ("load", load_spec([0, 1], [2, 2]), "two blocks into one"),
        ("load", (RemoteLoadStoreSpec((), (BlockHash(b""),)), CPULoadStoreSpec((0,))), "key"),
    ],
)
def test_invalid_specs_are_refused_and_reported_in_order(
    handlers: CpuRemoteOffloadingHandlers, direction: str, spec: TransferSpec, why: str
) -> None:
    h = handlers.cpu_to_remote_handler if direction == "store" else handlers.remote_to_cpu_handler
    assert h.transfer_async(1, spec) is False
    (result,) = h.get_finished()
    assert (result.job_id, result.success, result.bytes_moved) == (1, False, 0)
    assert why in (result.error or "")


def test_shutdown_finishes_queued_jobs_then_refuses(
    handlers: CpuRemoteOffloadingHandlers,
) -> None:
    h = handlers.cpu_to_remote_handler
    for j in range(8):
        h.transfer_async(j, store_spec([j], [j]))
    h.shutdown()
    h.shutdown()
    assert h.transfer_async(8, store_spec([0], [0])) is False
    results = h.get_finished()
    assert [r.success for r in results] == [True] * 8 + [False]
    assert "shut down" in (results[-1].error or "")
    h.wait([12345])


def test_bad_pages_are_refused(server: RedisServer) -> None:
    store = RemoteStore.open(FP, RemoteOptions(url=server.url), environ={})
    try:
        for bad in (
            torch.zeros(4, 8, dtype=torch.float16),
            torch.zeros(8, 4, dtype=torch.uint8).t(),
        ):
            with pytest.raises(ValueError):
                CpuRemoteOffloadingHandlers(bad, store)
        with pytest.raises(ValueError):
            CpuRemoteOffloadingHandlers(torch.zeros(4, 8, dtype=torch.uint8), store, io_threads=0)
        assert np.asarray(store.exists_many([key(1)])).tolist() == [False]
    finally:
        store.close()


@pytest.fixture
def held() -> Iterator[tuple[ScriptedRedis, CpuRemoteOffloadingHandlers]]:
    """Handlers over a scripted server whose ``GET`` of key 0 waits for its release;
    one value outstanding per connection, so jobs 1 and 2 (keys 0 and 1) go out on
    connections of their own."""
    fake = ScriptedRedis()
    options = RemoteOptions(url=fake.url, timeout_s=30.0)
    store = RemoteStore.open(FP, options, environ={})
    fake.hold = {store.redis_key(key(0))}
    gen = torch.Generator().manual_seed(0)
    pages = torch.randint(0, 256, (NUM, BLOCK), dtype=torch.uint8, generator=gen)
    h = CpuRemoteOffloadingHandlers(pages, store, io_threads=2)
    h.pages = pages  # type: ignore[attr-defined]
    assert run(h.cpu_to_remote_handler, {1: store_spec([0, 1, 2], [0, 1, 2])})[1].success
    try:
        yield fake, h
    finally:
        fake.release.set()
        h.shutdown()
        store.close()
        fake.close()


def test_a_job_that_ends_first_is_reported_after_the_jobs_before_it(
    held: tuple[ScriptedRedis, CpuRemoteOffloadingHandlers], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_values, "WINDOW_BYTES", 1)
    fake, handlers = held
    h = handlers.remote_to_cpu_handler
    h.transfer_async(1, load_spec([0], [5]))  # held by the server
    h.transfer_async(2, load_spec([1], [6]))
    h.wait([2])
    assert h.get_finished() == []  # job 2 is done, but job 1 was submitted first
    fake.release.set()
    h.wait([1])
    results = h.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(1, True), (2, True)]
    pages: torch.Tensor = handlers.pages  # type: ignore[attr-defined]
    assert torch.equal(pages[5], pages[0]) and torch.equal(pages[6], pages[1])


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: threads
def test_a_child_forked_with_a_job_in_flight_fails_that_job_and_loads_on(
    held: tuple[ScriptedRedis, CpuRemoteOffloadingHandlers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's I/O is the parent's I/O thread's, which the child does not have: in
    the child it is reported failed at once, and the child's next jobs start a thread
    and connections of their own. In the parent the job ends as if nothing happened."""
    monkeypatch.setattr(remote_values, "WINDOW_BYTES", 1)
    fake, handlers = held
    h = handlers.remote_to_cpu_handler
    pages: torch.Tensor = handlers.pages  # type: ignore[attr-defined]
    h.transfer_async(1, load_spec([0], [5]))  # held by the server

    def child() -> bool:
        h.wait([1])
        (lost,) = h.get_finished()
        ok = not lost.success and "fork" in (lost.error or "")
        got = run(h, {2: load_spec([2], [7])})[2]
        return ok and got.success and torch.equal(pages[7], pages[2])

    run_in_forked_child(child, fake.release.set)
    h.wait([1])
    (result,) = h.get_finished()
    assert result.success and torch.equal(pages[5], pages[0])


class _CountingCondition(threading.Condition):
    """A condition that counts its waits and its notifies."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = self.notifies = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)

    def notify_all(self) -> None:
        self.notifies += 1
        super().notify_all()


class _ManualLoop:
    """Stands in for ``RemoteLoop``: keeps each batch's ``on_done`` for the test to call."""

    def __init__(self, store: RemoteStore, *, connections: int, name: str) -> None:
        self.done: list[Callable[[BatchResult], None]] = []

    def submit(
        self, op: Op, keys: object, pages: object, on_done: Callable[..., None], names: object
    ) -> None:
        self.done.append(on_done)

    def close(self) -> None:
        pass


def test_wait_for_many_jobs_is_woken_once_when_the_last_ends(
    pages: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake-up per job cost the loop's thread a futex call and a GIL handover each;
    ``wait`` is woken only when the last of its jobs ends, whatever their order."""
    monkeypatch.setattr(cpu_remote, "RemoteLoop", _ManualLoop)
    store = RemoteStore.open(FP, RemoteOptions(url="redis://127.0.0.1:1/0"), environ={})
    h = CpuRemoteOffloadingHandlers(pages, store, io_threads=2).cpu_to_remote_handler
    cv = h._cv = _CountingCondition()  # type: ignore[attr-defined]
    for job in (1, 2, 3):
        assert h.transfer_async(job, store_spec([job], [job]))
    done: list[Callable[[BatchResult], None]] = h._loop.done  # type: ignore[attr-defined]
    waiter = threading.Thread(target=h.wait, args=([1, 2, 3],), daemon=True)
    waiter.start()
    ok = BatchResult(None, (), 0.0)
    try:
        deadline = time.monotonic() + 30
        while not cv.waits:  # the waiting thread is in ``wait``, counted on all three jobs
            assert time.monotonic() < deadline and waiter.is_alive()
            time.sleep(0.001)
        done[0](ok)
        done[2](ok)
        assert cv.notifies == 0 and waiter.is_alive()
    finally:
        done[1](ok)
    waiter.join(30)
    assert not waiter.is_alive() and cv.notifies == 1 and cv.waits == 1
    assert [r.job_id for r in h.get_finished()] == [1, 2, 3]
    h.wait([1, 2, 3, 99])  # reported or unknown: no wait
    assert cv.waits == 1
