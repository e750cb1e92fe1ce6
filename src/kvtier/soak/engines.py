"""The soak's side of one engine process: start it, ask it, SIGKILL it.

Runs in the soak process. A reader thread moves the child's protocol lines into a
queue, so every wait has a timeout: an engine that hangs is a crash, not a stalled
soak.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from kvtier.soak.child import PREFIX


class EngineGone(Exception):
    """The engine process died, hung past the timeout, or reported an exception."""


class EngineProcess:
    """One ``kvtier.soak.child`` process.

    Args:
        name: ``"a"`` or ``"b"`` (logs go to ``<logdir>/engine-<name>.log``).
        config: the child's JSON configuration.
        logdir: where its stderr goes.
    """

    def __init__(self, name: str, config: dict[str, Any], logdir: Path) -> None:
        self.name = name
        self.config = config
        self.logdir = logdir
        self.proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.recovered = 0
        self._reader: threading.Thread | None = None

    def start(self, timeout_s: float) -> float:
        """Start the process and wait for ``ready``; its start-up seconds.

        Raises:
            EngineGone: it exited or did not get ready in ``timeout_s``.
        """
        self._lines = queue.Queue()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(self.logdir / f"engine-{self.name}.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kvtier.soak.child", json.dumps(self.config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        assert self.proc.stdout is not None
        threading.Thread(
            target=self._read, args=(self.proc.stdout, self._lines), daemon=True
        ).start()
        ready = self._next(timeout_s)
        self.recovered = int(ready["recovered"])
        return float(ready["startup_s"])

    @staticmethod
    def _read(stream: IO[str], lines: queue.Queue[dict[str, Any] | None]) -> None:
        with stream:
            for line in stream:
                if line.startswith(PREFIX):
                    lines.put(json.loads(line[len(PREFIX) :]))
        lines.put(None)  # end of stream: the process is gone

    def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            msg = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise EngineGone(f"engine {self.name} answered nothing in {timeout_s:.0f} s") from None
        if msg is None:
            code = self.proc.wait() if self.proc is not None else None
            raise EngineGone(f"engine {self.name} exited (code {code})")
        if "error" in msg:
            raise EngineGone(f"engine {self.name} raised:\n{msg['error']}")
        return msg

    def send(self, prompt: list[int], max_new_tokens: int) -> None:
        """Send one request (the answer comes from ``receive``)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"prompt": prompt, "max_new_tokens": max_new_tokens}))
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise EngineGone(f"engine {self.name} is gone ({e})") from e

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The answer to the request sent last.

        Raises:
            EngineGone: the process died, hung or raised.
        """
        return self._next(timeout_s)

    def sigkill(self) -> None:
        """SIGKILL the process (mid-request, mid-store: whatever it was doing)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            if self._reader is not None:
                self._reader.join(timeout=5)  # it closes stdout at end of stream
            self.proc = None

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the engine to flush and close; SIGKILL it if it does not."""
        if self.proc is None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"close": true}\n')
            self.proc.stdin.flush()
            self._next(timeout_s)
            self.proc.wait(timeout=timeout_s)
        except (OSError, EngineGone, subprocess.TimeoutExpired):
            pass
        self.sigkill()
