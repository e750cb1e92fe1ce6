"""The test helper ``RedisServer`` (tests/redis_server.py): its port is picked free, not
reserved, so a first start that finds it taken moves to another; a restart keeps it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.redis_server import PortTaken, RedisServer, free_port


def test_a_port_taken_before_the_first_start_is_given_up_for_another(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    with socket.create_server(("127.0.0.1", free_port())) as taken:
        server.port = taken.getsockname()[1]  # as if another process bound it first
        server.start()
        try:
            assert server.port != taken.getsockname()[1]
            with server.client() as client:
                assert client.info("server")["process_id"] == server.proc.pid  # type: ignore[union-attr]
        finally:
            server.stop()


def test_a_restart_keeps_its_port_even_when_taken(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    port = server.port
    server.kill()
    with socket.create_server(("127.0.0.1", port)), pytest.raises(PortTaken):
        server.start()  # clients know this port: moving would hide the outage
    assert server.port == port and server.proc is None
    server.start()
    try:
        assert server.port == port
    finally:
        server.stop()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone once its parent (init) reaps it.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_server_dies_with_a_test_process_killed_before_stopping_it(tmp_path: Path) -> None:
    """pytest killed by a timeout runs no fixture teardown: the server must not outlive it."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tests.redis_server import RedisServer\n"
        f"s = RedisServer(Path({str(tmp_path / 'redis')!r})).start()\n"
        "print(s.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            server_pid = int(child.stdout.readline())
            assert not _gone(server_pid)
            child.send_signal(signal.SIGKILL)  # no teardown runs
            child.wait()
            deadline = time.monotonic() + 30.0
            while not _gone(server_pid):
                assert time.monotonic() < deadline, f"redis-server {server_pid} outlived its test"
                time.sleep(0.05)
        finally:
            child.kill()
