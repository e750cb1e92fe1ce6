"""Lanes and pooled handlers in a child forked while the parent's threads work on them:
the child's jobs run and are reported, the parent's unfinished ones are reported
failed in the child (never run twice, never left pending), the parent is unaffected."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.load_store_specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.media.disk import DiskStore
from kvtier.media.disk_layout import block_file_size
from kvtier.worker import KVLayout
from kvtier.worker.cpu_disk import CpuDiskOffloadingHandlers
from kvtier.worker.doorbell import _LIBS_LOCK, Doorbell, NativeDoorbell, PyDoorbell
from kvtier.worker.gpu_cpu import CpuGpuOffloadingHandlers
from kvtier.worker.handler import TransferResult, TransferSpec
from kvtier.worker.lanes import ThreadLane
from kvtier.worker.thread_pool_handler import PooledHandler, Task

from ..forking import held_by_another_thread, run_in_forked_child
from .conftest import require_native
from .test_lanes import BELLS, make_bell

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


@pytest.mark.parametrize("bell", BELLS)
def test_a_lane_forked_in_the_middle_of_a_job_runs_the_childs_jobs(bell: str) -> None:
    """At the fork the worker thread runs job 1 (holding the lane's runner lock, which
    stays taken in the child) and job 2 waits behind it: in the child both are reported
    failed, in order, and job 3 runs whether a caller waits for it or not."""
    lane = ThreadLane("forked-lane", make_bell(bell))
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
            got = summary(lane.poll() + polled(lane, 1))
            lane.close()
            return got == [(0, True, 5), (1, False, 0), (2, False, 0), (3, True, 13), (4, True, 17)]

        run_in_forked_child(child, release.set)
        lane.wait([2])
        assert summary(lane.poll()) == [(0, True, 5), (1, True, 7), (2, True, 11)]
    finally:
        release.set()
        lane.close()


@pytest.mark.parametrize("bell", BELLS)
def test_a_lane_forked_while_idle_starts_its_childs_unwaited_jobs(bell: str) -> None:
    """The worker thread sleeps on the doorbell at the fork: the child's job, which no
    caller waits for, is started by a worker thread of the child's own."""
    lane = ThreadLane("idle-lane", make_bell(bell))
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


@pytest.mark.parametrize("which", ["lane", "bell", "bell library"])
def test_a_lane_forked_while_a_parent_thread_holds_its_lock_or_its_bells(which: str) -> None:
    """A lock another thread of the parent holds at the fork stays held in the child
    (that thread is not there to release it): the lane's own; the Python bell's, which
    ``ring`` takes (the compiled bell's mutex is held for a moment the same way, which
    no test can hold open); or the lock around loading the compiled bell's library,
    which renewing a compiled bell must not take."""
    bell: Doorbell = NativeDoorbell(require_native()) if which == "bell library" else PyDoorbell()
    lane = ThreadLane("held-lane", bell)
    held = {"lane": lane._lock, "bell": getattr(bell, "_cond", None), "bell library": _LIBS_LOCK}
    try:

        def child() -> bool:
            lane.submit(1, returns(9))  # ``ring`` takes the bell's lock
            lane.wait([1])
            lane.submit(2, returns(4))
            got = summary(lane.poll() + polled(lane, 1))
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
