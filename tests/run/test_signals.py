"""``kvtier run`` stopped by SIGTERM or Ctrl-C: one line, its exit status, no temp dir left.

A real ``python -m kvtier run`` process on the tiny checkpoint, with ``TMPDIR`` pointing
at the test's directory so that its disk tier's temporary directory can be watched:
the signal is sent once that directory exists (the run is then serving turns).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvtier

SRC = Path(kvtier.__file__).resolve().parents[1]


def _start(tmp_path: Path, checkpoint: Path) -> tuple[subprocess.Popen[str], Path]:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "kvtier", "run", "--model", str(checkpoint)]
    argv += ["--conversations", "3", "--turns", "200", "--system-tokens", "40"]
    argv += ["--user-tokens", "10-30", "--answer-tokens", "3-6", "--block-size", "4"]
    argv += ["--json", str(tmp_path / "out.json")]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, tmpdir


def _wait_for_temp_dir(proc: subprocess.Popen[str], tmpdir: Path) -> Path:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = list(tmpdir.glob("kvtier-run-*"))
        if found:
            return found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the run never made its temporary directory: {out}\n{err}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status", "word"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
)
def test_a_stopped_run_says_one_line_and_removes_its_temp_dir(
    tmp_path: Path, tiny_checkpoint: Path, signum: int, status: int, word: str
) -> None:
    proc, tmpdir = _start(tmp_path, tiny_checkpoint)
    temp = _wait_for_temp_dir(proc, tmpdir)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == f"kvtier run: {word}"
    assert not temp.exists()
    assert not (tmp_path / "out.json").exists()  # no half-written results
