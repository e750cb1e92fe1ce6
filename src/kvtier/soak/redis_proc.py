"""The soak's own ``redis-server``: a child on a free loopback port, faults on demand.

Runs in the soak process. No persistence (a killed server comes back empty), a
``maxmemory`` with ``allkeys-lru`` (the server owns the remote tier's capacity).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kvtier.errors import ConfigError

_START_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """One ``redis-server`` child; ``start`` after ``kill`` reuses the port.

    Args:
        workdir: a directory for the server's log and working files.
        maxmemory: the server's ``maxmemory`` (``"64mb"``).

    Raises:
        ConfigError: ``redis-server`` is not on ``PATH``.
    """

    def __init__(self, workdir: Path, maxmemory: str = "64mb") -> None:
        if shutil.which("redis-server") is None:
            raise ConfigError(
                "redis-server", "not on PATH: install it (apt-get install -y redis-server)"
            )
        self.workdir = workdir
        self.maxmemory = maxmemory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (empty) and wait until it accepts connections."""
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        cmd += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.stopped = False
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        log_text = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
        self.close()
        raise RuntimeError(f"redis-server did not start:\n{log_text}")

    def kill(self) -> None:
        """SIGKILL: a crash; everything the server held is lost."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket and answers nothing (a hung server)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)
            self.stopped = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.stopped = False

    def close(self) -> None:
        """Stop the server if it runs (continued first if stopped)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
