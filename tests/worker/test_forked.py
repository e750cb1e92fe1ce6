"""Lanes and pooled handlers in a child forked while the parent's threads work on them:
the child's jobs run and are reported, the parent's unfinished ones are reported
failed in the child (never run twice, never left pending), the parent is unaffected."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.media import disk, forks
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.worker import KVLayout
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
from kvtier.worker.gpu_cpu import CpuGpuOffloadingHandlers
from kvtier.worker.handler import TransferResult, TransferSpec
from kvtier.worker.lanes import ThreadLane
from kvtier.worker.thread_pool_handler import PooledHandler, Task

from ..forking import held_by_another_thread, run_in_forked_child
from .conftest import require_native

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),  # Python 3.12+
    pytest.mark.timeout(120),
]


def returns(nbytes: int) -> Callable[[], tuple[int, None]]:
    return lambda: (nbytes, None)


def blocks_until(event: threading.Event, started: threading.Event | None = None):  # type: ignore[no-untyped-def]
    def fn() -> tuple[int, None]:
        if started is not None:
            started.set()
        event.wait()
        return 7, None

    return fn


def polled(lane: ThreadLane | PooledHandler, n: int) -> list[TransferResult]:
    """``n`` reports, polling without ``wait`` (so no caller runs a job); what came
    within 30 s if fewer."""
    out: list[TransferResult] = []
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        out += lane.poll() if isinstance(lane, ThreadLane) else lane.get_finished()
        time.sleep(0.001)
    return out


def summary(results: list[TransferResult]) -> list[tuple[int, bool, int]]:
    return [(r.job_id, r.success, r.bytes_moved) for r in results]


def test_a_lane_forked_in_the_middle_of_a_job_runs_the_childs_jobs() -> None:
    """At the fork the worker thread runs job 1 (holding the lane's runner lock, which
    stays taken in the child) and job 2 waits behind it: in the child both are reported
    failed, in order, and job 3 runs whether a caller waits for it or not."""
    lane = ThreadLane("forked-lane")
    release, started = threading.Event(), threading.Event()
    try:
        lane.submit(0, returns(5))
        lane.wait([0])
        lane.submit(1, blocks_until(release, started))
        lane.submit(2, returns(11))
        assert started.wait(30)

        def child() -> bool:
            lane.submit(3, returns(13))
            lane.wait([3])  # run by this caller: the runner lock is a new one
            lane.submit(4, returns(17))  # run by a new worker thread: nobody waits
            got = summary(polled(lane, 5))
            lane.close()
            return got == [(0, True, 5), (1, False, 0), (2, False, 0), (3, True, 13), (4, True, 17)]

        run_in_forked_child(child, release.set)
        lane.wait([2])
        assert summary(lane.poll()) == [(0, True, 5), (1, True, 7), (2, True, 11)]
    finally:
        release.set()
        lane.close()


def test_a_lane_forked_while_idle_starts_its_childs_unwaited_jobs() -> None:
    """The worker thread sleeps on the lane's condition at the fork: the child's job,
    which no caller waits for, is started by a worker thread of the child's own."""
    lane = ThreadLane("idle-lane")
    try:
        lane.submit(0, returns(3))
        lane.wait([0])

        def child() -> bool:
            lane.submit(1, returns(9))
            got = summary(polled(lane, 2))
            lane.close()
            return got == [(0, True, 3), (1, True, 9)]

        run_in_forked_child(child, lambda: None)
        lane.submit(2, returns(4))
        assert summary(polled(lane, 2)) == [(0, True, 3), (2, True, 4)]
    finally:
        lane.close()


@pytest.mark.parametrize("which", ["lock", "runner"])
def test_a_lane_forked_while_a_parent_thread_holds_its_locks(which: str) -> None:
    """A lock another thread of the parent holds at the fork stays held in the child
    (that thread is not there to release it): the lane's own, which ``submit`` takes,
    and the runner lock, which ``wait`` takes to run a job."""
    lane = ThreadLane("held-lane")
    held = {"lock": lane._lock, "runner": lane._runner}
    try:

        def child() -> bool:
            lane.submit(1, returns(9))
            lane.wait([1])
            lane.submit(2, returns(4))
            got = summary(polled(lane, 2))
            lane.close()
            return got == [(1, True, 9), (2, True, 4)]

        with held_by_another_thread(held[which]) as release:
            run_in_forked_child(child, release.set)
        lane.submit(3, returns(1))
        lane.wait([3])
        assert summary(lane.poll()) == [(3, True, 1)]
    finally:
        lane.close()


def test_a_lane_closed_before_the_fork_stays_closed_in_the_child() -> None:
    lane = ThreadLane("closed-lane")
    lane.submit(0, returns(3))
    lane.close()

    def child() -> bool:
        lane.submit(1, returns(9))
        got = lane.poll()
        lane.close()
        return summary(got) == [(0, True, 3), (1, False, 0)] and got[1].error == "lane is closed"

    run_in_forked_child(child, lambda: None)


class _Gated(PooledHandler):
    """A job of ``n`` tasks; each waits for the gate (a spec is ``(n, nbytes)``)."""

    def __init__(self, gate: threading.Event, started: threading.Event) -> None:
        super().__init__(
            src_medium=Medium.CPU, dst_medium=Medium.DISK, io_threads=1, thread_name="gated"
        )
        self.gate, self.started = gate, started

    def _plan(self, spec: TransferSpec) -> list[Task]:
        n, nbytes = spec  # type: ignore[misc]

        def run() -> int:
            self.started.set()
            self.gate.wait()
            return nbytes  # type: ignore[no-any-return]

        return [(f"task {i}", run) for i in range(n)]  # type: ignore[arg-type]


def test_a_pooled_handler_forked_in_the_middle_of_a_job_runs_the_childs_jobs() -> None:
    """At the fork the pool's one thread runs a task of job 1 and another waits: the
    child's pool has no thread (its executor would queue job 2's task for ever) and the
    parent's job would stay pending, holding every later report back. In the child job
    1 is reported failed and job 2 runs."""
    gate, started = threading.Event(), threading.Event()
    handler = _Gated(gate, started)
    try:
        handler.transfer_async(1, (2, 100))  # type: ignore[arg-type]
        assert started.wait(30)

        def child() -> bool:
            gate.set()  # the child's copy of the gate: its own tasks run through
            handler.transfer_async(2, (1, 5))  # type: ignore[arg-type]
            handler.wait([2])
            got = handler.get_finished()
            handler.shutdown()
            return summary(got) == [(1, False, 0), (2, True, 5)] and "handler forked" in (
                got[0].error or ""
            )

        run_in_forked_child(child, gate.set)
        handler.wait([1])
        assert summary(handler.get_finished()) == [(1, True, 200)]
    finally:
        gate.set()
        handler.shutdown()


def test_a_gpu_cpu_handler_forked_while_its_copier_is_held_copies_in_the_child() -> None:
    """The compiled row copier takes its route's lock for each copy (the lane's thread
    holds it for the copy's length): a child forked meanwhile copies with a new one,
    byte-exact."""
    require_native()
    kv = [torch.randint(0, 256, (2, 8, 4, 2, 8), dtype=torch.uint8) for _ in range(2)]
    handlers = CpuGpuOffloadingHandlers(kv, 4, 4, 8, KVLayout.KV_FIRST)
    store = (GPULoadStoreSpec((BlockId(5), BlockId(2))), CPULoadStoreSpec((BlockId(1), BlockId(6))))
    g2c = handlers.gpu_to_cpu_handler
    assert g2c._copier.kind == "native"  # type: ignore[attr-defined]
    route = g2c._copier._routes[0]  # type: ignore[attr-defined]
    try:

        def child() -> bool:
            g2c.transfer_async(1, store)
            g2c.wait([1])
            ok = [r.success for r in g2c.get_finished()] == [True]
            slab = handlers.host_slab.tensor.view(8, -1)
            view = handlers.kv_view
            want = [torch.cat([f[g].reshape(-1) for f in view.fragments]) for g in (5, 2)]
            return ok and all(torch.equal(slab[c], w) for c, w in zip((1, 6), want, strict=True))

        with held_by_another_thread(route._lock) as release:
            run_in_forked_child(child, release.set)
    finally:
        handlers.shutdown()


def test_a_disk_handler_forked_while_the_store_is_held_stores_and_loads_in_the_child(
    tmp_path: Path,
) -> None:
    """A disk I/O thread takes the store's mutex for every slot it reserves or frees:
    a child forked while another thread holds it stores and loads its blocks."""
    store = DiskStore.open(tmp_path, b"\x44" * 32, 8 * block_file_size(4096))
    pages = torch.randint(0, 256, (4, 4096), dtype=torch.uint8)
    handlers = CpuDiskOffloadingHandlers(pages, store, io_threads=2)
    keys = (BlockHash(b"\x01" * 32), BlockHash(b"\x02" * 32))
    ids = (BlockId(0), BlockId(1))
    back = (BlockId(2), BlockId(3))
    try:

        def child() -> bool:
            to_disk, to_cpu = handlers.cpu_to_disk_handler, handlers.disk_to_cpu_handler
            to_disk.transfer_async(1, (CPULoadStoreSpec(ids), DiskLoadStoreSpec(ids, keys)))
            to_disk.wait([1])
            to_cpu.transfer_async(2, (DiskLoadStoreSpec(back, keys), CPULoadStoreSpec(back)))
            to_cpu.wait([2])
            done = [r.success for r in to_disk.get_finished() + to_cpu.get_finished()]
            return done == [True, True] and torch.equal(pages[2:4], pages[0:2])

        with held_by_another_thread(store._mutex) as release:
            run_in_forked_child(child, release.set)
    finally:
        handlers.shutdown()
        store.close()


# -- forks inside a few bytecodes of another thread's update ------------------------
# Each holds another parent thread inside one of kvtier's multi-step updates across
# the fork (a container whose method pauses), where the child must still be right.


class _PauseOn:
    """Pauses the thread that calls ``hit`` with ``value`` until ``go`` is set."""

    def __init__(self, value: object) -> None:
        self.value, self.paused, self.go = value, threading.Event(), threading.Event()

    def hit(self, value: object) -> None:
        if value == self.value:
            self.paused.set()
            self.go.wait()


def test_a_job_half_submitted_at_the_fork_is_reported_after_the_queued_ones() -> None:
    """Job 1 runs, job 2 is queued and another thread is inside ``submit`` of job 3:
    the child reports 1, 2, 3 (failed), in submission order."""
    lane = ThreadLane("half-submit")
    release, started = threading.Event(), threading.Event()
    pause = _PauseOn(3)
    try:
        lane.submit(1, blocks_until(release, started))
        assert started.wait(30)
        lane.submit(2, returns(2))

        class PausingSet(set[int]):
            def add(self, job_id: int) -> None:
                super().add(job_id)
                pause.hit(job_id)

        lane._in_flight = PausingSet(lane._in_flight)
        lane._queue = _PausingQueue(lane._queue, lambda job: pause.hit(job[0]))
        submitter = threading.Thread(target=lane.submit, args=(3, returns(3)))
        submitter.start()
        assert pause.paused.wait(30)

        def child() -> bool:
            return [r.job_id for r in lane.poll()] == [1, 2, 3]

        def in_parent() -> None:
            pause.go.set()
            release.set()
            submitter.join()

        run_in_forked_child(child, in_parent)
        lane.wait([1, 2, 3])
        assert summary(lane.poll()) == [(1, True, 7), (2, True, 2), (3, True, 3)]
    finally:
        pause.go.set()
        release.set()
        lane.close()


class _PausingQueue(collections.deque):  # type: ignore[type-arg]
    def __init__(self, items: Iterable[Any], on_append: Callable[[Any], None]) -> None:
        super().__init__(items)
        self._on_append = on_append

    def append(self, item: Any) -> None:
        super().append(item)
        self._on_append(item)


def test_a_job_reported_in_the_parent_as_the_fork_came_is_reported_once() -> None:
    """The worker thread has appended job 1's report but not yet marked it done: the
    child reports it once, as it finished."""
    lane = ThreadLane("reported")
    pause = _PauseOn(1)
    try:
        lane._done = _PausingQueue((), lambda r: pause.hit(r.job_id))
        lane.submit(1, returns(1))
        assert pause.paused.wait(30)

        def child() -> bool:
            return summary(lane.poll()) == [(1, True, 1)]

        run_in_forked_child(child, pause.go.set)
    finally:
        pause.go.set()
        lane.close()


def test_a_pooled_job_half_added_at_the_fork_is_reported_failed_in_the_child() -> None:
    """Another thread has queued job 1 but not yet indexed it: in the child it is
    reported failed and job 2 runs (``get_finished`` once raised ``KeyError``)."""
    gate, started = threading.Event(), threading.Event()
    gate.set()
    handler = _Gated(gate, started)
    pause = _PauseOn(1)
    try:
        handler._jobs = _PausingQueue((), lambda job: pause.hit(job.job_id))
        adder = threading.Thread(target=handler.transfer_async, args=(1, (1, 4)))
        adder.start()
        assert pause.paused.wait(30)

        def child() -> bool:
            handler.transfer_async(2, (1, 5))  # type: ignore[arg-type]
            handler.wait([2])
            return summary(handler.get_finished()) == [(1, False, 0), (2, True, 5)]

        def in_parent() -> None:
            pause.go.set()
            adder.join()

        run_in_forked_child(child, in_parent)
        handler.wait([1])
        assert summary(handler.get_finished()) == [(1, True, 4)]
    finally:
        pause.go.set()
        handler.shutdown()


def test_a_pooled_handler_forked_while_a_parent_thread_holds_its_condition() -> None:
    gate, started = threading.Event(), threading.Event()
    gate.set()
    handler = _Gated(gate, started)
    try:

        def child() -> bool:
            handler.transfer_async(1, (2, 3))  # type: ignore[arg-type]
            handler.wait([1])
            return summary(handler.get_finished()) == [(1, True, 6)]

        with held_by_another_thread(handler._cv) as release:
            run_in_forked_child(child, release.set)
    finally:
        handler.shutdown()


def test_a_route_half_way_through_growing_at_the_fork_copies_the_right_rows() -> None:
    """A lane thread inside ``RowRoute._grow`` (the C struct already points at the new
    row buffers, the arrays the rows are written through not yet): the child's copies
    still move exactly the rows asked for."""
    native = require_native()
    src = torch.randint(0, 256, (200, 64), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    route = native.route([src], [dst])  # row buffers for 64 rows: 100 grows them
    pause = _PauseOn("grower")
    real = np.ctypeslib.as_array

    def as_array(obj: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        pause.hit(threading.current_thread().name)
        return real(obj, *args, **kwargs)

    rows = np.arange(100)
    grower = threading.Thread(target=route.copy, args=(rows, rows), name="grower")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np.ctypeslib, "as_array", as_array)
        grower.start()
        assert pause.paused.wait(30)

        def child() -> bool:
            dst.zero_()
            want = np.array([5, 7, 9])
            route.copy(want, want)
            return torch.equal(dst[want], src[want]) and int(dst.sum()) == int(src[want].sum())

        def in_parent() -> None:
            pause.go.set()
            grower.join()

        try:
            run_in_forked_child(child, in_parent)
        finally:
            pause.go.set()
    assert torch.equal(dst[:100], src[:100])


def test_slots_reserved_by_the_parents_writes_in_flight_are_free_in_the_child(
    tmp_path: Path,
) -> None:
    """A parent thread is writing a block (its slot reserved) at the fork: the child's
    tier still holds as many blocks of its own as it has slots."""
    store = DiskStore.open(tmp_path, b"\x45" * 32, 4 * block_file_size(4096))
    page = np.zeros(4096, np.uint8)
    pause = _PauseOn("writer")
    real = disk.pwrite_all

    def pwrite_all(*args: Any) -> Any:
        pause.hit(threading.current_thread().name)
        return real(*args)

    writer = threading.Thread(target=store.write, args=(b"\x01" * 32, page), name="writer")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(disk, "pwrite_all", pwrite_all)
            writer.start()
            assert pause.paused.wait(30)

            def child() -> bool:
                free = store.free_bytes
                for k in (2, 3, 4, 5):
                    store.write(bytes([k]) * 32, page)
                return free == 4 * block_file_size(4096) and len(store) == 4

            def in_parent() -> None:
                pause.go.set()
                writer.join()

            run_in_forked_child(child, in_parent)
        assert store.keys() == [b"\x01" * 32]
    finally:
        pause.go.set()
        store.close()


def test_an_object_that_fails_to_renew_leaves_the_others_renewed() -> None:
    class Broken:
        def _after_fork(self) -> None:
            raise MemoryError("no memory for a new lock")

    lanes = [ThreadLane(f"renewed-{i}") for i in range(6)]
    broken = Broken()
    forks.renew_after_fork(broken)
    old = [lane._lock for lane in lanes]
    try:

        def child() -> bool:
            return not any(lane._lock is lock for lane, lock in zip(lanes, old, strict=True))

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(forks.logger, "disabled", True)  # the child logs the failure
            run_in_forked_child(child, lambda: None)
    finally:
        for lane in lanes:
            lane.close()
