"""ThreadLane: jobs run one at a time in submission order, by the worker thread or by a
caller blocked in ``wait``, and each is reported exactly once, in order."""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvtier.cli import STOP_SIGNALS, _on_signal
from kvtier.worker.lanes import ThreadLane


class Recorder:
    """Job functions that log who ran them and catch two jobs running at once."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, str]] = []
        self.overlaps = 0
        self._active = 0
        self._lock = threading.Lock()

    def job(self, job_id: int, nbytes: int, *, raises: bool = False, sleep: float = 0.0):  # type: ignore[no-untyped-def]
        def fn() -> tuple[int, None]:
            with self._lock:
                self._active += 1
                self.overlaps += self._active > 1
            try:
                if sleep:
                    time.sleep(sleep)  # lets the other thread try to run the next job
                self.ran.append((job_id, threading.current_thread().name))
                if raises:
                    raise ValueError(f"job {job_id} broke")
                return nbytes, None
            finally:
                with self._lock:
                    self._active -= 1

        return fn


@pytest.mark.timeout(30)  # a job left in flight would hang wait
def test_wait_runs_a_queued_job_in_the_callers_thread() -> None:
    # With a long switch interval the woken worker thread cannot take the GIL before
    # the caller blocks, so the caller finds the job still queued and runs it itself.
    lane, rec = ThreadLane("lane-under-test"), Recorder()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        lane.submit(1, rec.job(1, 10))
        lane.wait([1])
    finally:
        sys.setswitchinterval(old)
    assert rec.ran == [(1, threading.current_thread().name)]
    (result,) = lane.poll()
    assert (result.job_id, result.success, result.bytes_moved) == (1, True, 10)
    lane.close()


@pytest.mark.timeout(30)  # a job left in flight would hang wait
def test_interrupt_in_a_job_run_by_the_caller_still_reports_it() -> None:
    lane, rec = ThreadLane("lane-under-test"), Recorder()

    def interrupted() -> tuple[int, None]:
        raise KeyboardInterrupt

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        lane.submit(1, interrupted)
        with pytest.raises(KeyboardInterrupt):
            lane.wait([1])
    finally:
        sys.setswitchinterval(old)
    lane.submit(2, rec.job(2, 5))
    lane.wait([1, 2])  # returns: job 1 is not left in flight
    results = lane.poll()
    assert [(r.job_id, r.success) for r in results] == [(1, False), (2, True)]
    assert results[0].error == "KeyboardInterrupt: "
    lane.close()


@pytest.mark.timeout(30)  # a job left in flight would hang wait
def test_waiter_never_overtakes_the_job_the_worker_runs() -> None:
    lane, rec, release = ThreadLane("lane-under-test"), Recorder(), threading.Event()
    started = threading.Event()

    def blocking() -> tuple[int, None]:
        started.set()
        release.wait()
        rec.ran.append((1, threading.current_thread().name))
        return 1, None

    lane.submit(1, blocking)
    started.wait()
    lane.submit(2, rec.job(2, 2))
    waiter = threading.Thread(target=lane.wait, args=([2],))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive() and rec.ran == []  # job 2 waits behind job 1
    release.set()
    waiter.join()
    assert [j for j, _ in rec.ran] == [1, 2]
    assert rec.ran[0][1] == "lane-under-test"
    assert [r.job_id for r in lane.poll()] == [1, 2]
    lane.close()


@pytest.mark.timeout(30)  # a job left in flight would hang wait
def test_close_returns_only_after_a_job_a_caller_runs() -> None:
    # A caller that submits and waits at once runs the job itself (the woken worker
    # thread cannot take the GIL first under a long switch interval); the worker thread
    # then finds the queue empty, so close() must still wait for the caller's job.
    lane, started, finished = ThreadLane("lane-under-test"), threading.Event(), threading.Event()
    ran_by: list[str] = []

    def slow() -> tuple[int, None]:
        ran_by.append(threading.current_thread().name)
        started.set()
        time.sleep(0.2)
        finished.set()
        return 1, None

    def submit_and_wait() -> None:
        lane.submit(1, slow)
        lane.wait([1])

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        caller = threading.Thread(target=submit_and_wait, name="caller")
        caller.start()
        assert started.wait(10)
    finally:
        sys.setswitchinterval(old)
    lane.close()
    assert ran_by == ["caller"]
    assert finished.is_set()  # no job runs once close() has returned
    caller.join()
    assert [(r.job_id, r.success) for r in lane.poll()] == [(1, True)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("jobs", [1, 5])
def test_submit_never_runs_a_job_in_the_submitting_thread(jobs: int) -> None:
    # ``submit`` returns without running the job (the worker protocol: transfer_async
    # never blocks on the copy), even for a tiny job on an idle lane. Nobody waits here,
    # so only the lane's thread may run it; each job is submitted after the previous
    # one is reported, i.e. to an idle lane. (A caller blocked in ``wait`` may run
    # queued jobs itself: not checked here, no ``wait`` is called.)
    lane = ThreadLane("lane-under-test")
    caller = threading.get_ident()
    for job_id in range(jobs):
        ran_by: list[int] = []
        done = threading.Event()

        def fn(ran_by: list[int] = ran_by, done: threading.Event = done) -> tuple[int, None]:
            ran_by.append(threading.get_ident())
            done.set()
            return 1, None

        lane.submit(job_id, fn)
        assert done.wait(60)
        results = []
        deadline = time.monotonic() + 60
        while not results and time.monotonic() < deadline:
            results = lane.poll()
            time.sleep(0.001)
        assert [(r.job_id, r.success) for r in results] == [(job_id, True)]
        assert len(ran_by) == 1 and ran_by[0] != caller
    lane.close()


@pytest.mark.timeout(120)
def test_a_job_submitted_while_closing_is_refused_after_the_earlier_ones() -> None:
    # close() runs what is queued first; a job submitted meanwhile is refused, but its
    # report comes after the earlier jobs' (it was once reported at once, ahead of a
    # job still running)
    lane = ThreadLane("lane-under-test")
    running, release = threading.Event(), threading.Event()

    def slow() -> tuple[int, None]:
        running.set()
        assert release.wait(60)
        return 1, None

    lane.submit(1, slow)
    assert running.wait(60)
    closer = threading.Thread(target=lane.close)
    closer.start()
    deadline = time.monotonic() + 60
    while not lane._closed and time.monotonic() < deadline:
        time.sleep(0.001)
    assert lane._closed
    lane.submit(2, lambda: (2, None))
    assert lane.poll() == []  # job 1 still runs: nothing may be reported before it
    release.set()
    closer.join(60)
    assert not closer.is_alive()
    reports = [(r.job_id, r.success, r.error) for r in lane.poll()]
    assert reports == [(1, True, None), (2, False, "lane is closed")]
    lane.submit(3, lambda: (3, None))  # after close returned: refused at once
    assert [(r.job_id, r.success) for r in lane.poll()] == [(3, False)]


class _SignalAtPop(collections.deque):  # type: ignore[type-arg]
    """A lane's queue whose first pop raises SIGINT in this process (the handler runs
    at the pop's next bytecode, the job already taken off the queue)."""

    popped = 0

    def popleft(self):  # type: ignore[no-untyped-def]
        item = super().popleft()
        self.popped += 1
        if self.popped == 1:
            signal.raise_signal(signal.SIGINT)
        return item


@pytest.mark.timeout(30)  # a job left in flight would hang wait
def test_a_stop_signal_while_a_caller_takes_a_job_waits_until_it_is_reported() -> None:
    # kvtier's stop handler once raised between a waiting caller's pop of a job and
    # its try/finally; the job stayed in flight and close hung. Under a long switch
    # interval the woken worker cannot take the GIL first: the caller pops the job.
    lane = ThreadLane("lane-under-test")
    lane._queue = queue = _SignalAtPop()
    previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        lane.submit(1, lambda: (7, None))
        with pytest.raises(KeyboardInterrupt):
            lane.wait([1])
    finally:
        sys.setswitchinterval(old)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert queue.popped == 1
    lane.wait([1])  # returns: the job ran whole and was reported
    assert [(r.job_id, r.success, r.bytes_moved) for r in lane.poll()] == [(1, True, 7)]
    lane.close()


@pytest.mark.timeout(120)
def test_the_worker_outlives_jobs_its_callers_take() -> None:
    # callers that wait run their jobs themselves, often before the woken worker
    # looks: the worker must go back to sleep, not leave, and still start a job
    # nobody waits for afterwards (a worker that leaves when it finds the queue
    # empty passes every other test)
    lane = ThreadLane("lane-under-test")
    for job_id in range(300):
        lane.submit(job_id, lambda: (0, None))
        lane.wait([job_id])
        time.sleep(0.0002)  # most often the worker is asleep again when the next rings
    started = threading.Event()
    lane.submit(300, lambda: (started.set(), (0, None))[1])
    assert started.wait(60), "a job nobody waits for never started"
    lane.close()
    assert len(lane.poll()) == 301


class LaneMachine(RuleBasedStateMachine):
    """Submit, wait, poll and close in any order, against a list model."""

    def __init__(self) -> None:
        super().__init__()
        self.lane = ThreadLane("lane-under-test")
        self.rec = Recorder()
        self.next_id = 0
        self.submitted: list[tuple[int, str]] = []  # (job id, "ok" | "raise" | "refused")
        self.reported: list[int] = []
        self.results: dict[int, tuple[bool, int]] = {}
        self.closed = False

    def _take(self) -> None:
        for r in self.lane.poll():
            self.reported.append(r.job_id)
            self.results[r.job_id] = (r.success, r.bytes_moved)

    @rule(kind=st.sampled_from(["ok", "raise", "refused", "slow"]))
    def submit(self, kind: str) -> None:
        job_id, self.next_id = self.next_id, self.next_id + 1
        if kind == "refused":
            self.lane.submit(job_id, None, "refused here")
        else:
            fn = self.rec.job(
                job_id, 100 + job_id, raises=kind == "raise", sleep=0.002 if kind == "slow" else 0
            )
            self.lane.submit(job_id, fn)
        self.submitted.append((job_id, "refused" if self.closed else kind))

    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        ids = [j for j, _ in self.submitted]
        chosen = data.draw(st.lists(st.sampled_from(ids), max_size=3)) if ids else []
        self.lane.wait(chosen)
        self._take()
        assert set(chosen) <= set(self.reported)  # waited-for jobs are done

    @rule()
    def poll(self) -> None:
        self._take()

    @rule()
    def close(self) -> None:
        self.lane.close()
        self.closed = True
        self._take()
        assert self.reported == [j for j, _ in self.submitted]  # nothing left behind

    @invariant()
    def reported_once_in_submission_order(self) -> None:
        assert self.reported == [j for j, _ in self.submitted][: len(self.reported)]

    @invariant()
    def ran_one_at_a_time_in_order(self) -> None:
        assert self.rec.overlaps == 0
        ran = [j for j, _ in self.rec.ran]
        runnable = [j for j, kind in self.submitted if kind not in ("refused",)]
        assert ran == runnable[: len(ran)]

    @invariant()
    def results_say_what_happened(self) -> None:
        kinds = dict(self.submitted)
        for job_id, (success, nbytes) in self.results.items():
            ok = kinds[job_id] in ("ok", "slow")
            assert (success, nbytes) == ((True, 100 + job_id) if ok else (False, 0))

    def teardown(self) -> None:
        self.lane.close()
        assert not self.lane._thread.is_alive()


LaneMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_lane_machine = LaneMachine.TestCase
