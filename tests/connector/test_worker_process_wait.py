"""``WorkerProcess.wait`` cut short by a stop signal loses nothing and misleads no
later wait (review of the Ctrl-C fix).

The parent's end of the pipe only: a ``WorkerProcess`` built without its child
(``__new__``), and the child's replies written into the other end by the test (in
order; the one reply that must come late comes from a thread).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import pytest

from kvtier.cli import STOP_SIGNALS, _on_signal
from kvtier.connector.worker_process import Finished, Wait, Waited, WorkerProcess
from kvtier.jobs import TransferResult


def ok(job_id: int) -> TransferResult:
    return TransferResult(job_id, True, 64, 0.001)


def parent_end(conn: Any, pending: set[int], waits: int) -> WorkerProcess:
    worker = WorkerProcess.__new__(WorkerProcess)
    worker._conn = conn
    worker._results, worker._pending, worker._dead = [], set(pending), None
    worker._closed, worker._waits = False, waits
    return worker


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    parent, child = Pipe()
    yield parent, child
    parent.close()
    child.close()


def test_the_reply_of_a_wait_cut_short_never_ends_a_later_wait(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    worker = parent_end(parent, pending={1, 2}, waits=1)  # wait 1 was cut short
    child.send(Finished((ok(1),)))  # the child's reply to wait 1, never read
    child.send(Waited(1))

    def reply_to_wait_2() -> None:  # the child answers wait 2 once job 2 is done
        assert child.recv() == Wait((2,), 2)
        time.sleep(0.2)  # job 2 still running: a wait that returned now returned early
        child.send(Finished((ok(2),)))
        child.send(Waited(2))

    replier = threading.Thread(target=reply_to_wait_2)
    replier.start()
    worker.wait([2])
    assert [r.job_id for r in worker.get_finished()] == [1, 2]  # wait 2 ended on its own reply
    assert worker._pending == set()
    replier.join()


class SignalsOnReceipt:
    """A pipe end whose first receipt raises SIGINT in this process after the message
    left the pipe and before it is returned."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.fired = conn, False

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self.conn.poll(timeout)

    def send(self, message: object) -> None:
        self.conn.send(message)

    def recv(self) -> object:
        message = self.conn.recv()
        if not self.fired:
            self.fired = True
            signal.raise_signal(signal.SIGINT)  # its handler runs at the next bytecode
        return message


@pytest.mark.parametrize("call", ["wait", "get_finished"])
def test_a_stop_signal_as_a_reply_arrives_keeps_the_reply(
    pipe: tuple[Connection, Connection], call: str
) -> None:
    parent, child = pipe
    worker = parent_end(SignalsOnReceipt(parent), pending={1}, waits=0)
    child.send(Finished((ok(1),)))
    child.send(Waited(1))
    previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.wait([1]) if call == "wait" else worker.get_finished()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert [r.job_id for r in worker._results] == [1]
    assert worker._pending == set()
