"""How often ``kvtier run`` fails to stop cleanly on Ctrl-C (or SIGTERM): a stress loop.

``tests/run/test_signals.py`` stops one run, as soon as its temporary disk directory
appears; the hang it once had (a stop landing inside a hand-over between the
connector's halves, `docs/run.md`) showed in about 1 CI run of 20. This starts ``N``
real ``python -m kvtier run`` processes on a tiny checkpoint (built from the test
suite's ``TINY`` config with seed 0; nothing downloaded), sends the signal at a random
0-1 s after the directory appears (the run is then serving turns), and counts runs
that did not end within ``--limit`` seconds with the right status, the one-line
message and the directory removed. A hung run gets SIGABRT, so Python's faulthandler
(``-X faulthandler``) dumps every thread's stack into ``--dumps``. One summary line,
and JSON with the machine and commit. Run from the repository root::

    PYTHONPATH=src:. python benchmarks/ctrl_c_stress.py --runs 40 [--signal TERM]
        [--store-policy on_evict] [--out benchmarks/results/ctrl-c-stress.json]

On the development VM: 2 hangs in 40 and 2 in 60 before the fix (8230b64's parent),
0 in 80 and 0 in 40 after it (2026-11-24).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvtier.results import write_result

STATUS = {"INT": (130, "interrupted"), "TERM": (143, "terminated")}


def _checkpoint(where: Path) -> Path:
    import torch
    from tests.tiny import TINY

    from kvtier.engine import build_model

    torch.set_num_threads(1)
    path = where / "tiny-llama"
    build_model(TINY, seed=0, device="cpu").save_pretrained(path)
    return path


def _one(checkpoint: Path, signame: str, store_policy: str, limit: float, dumps: Path) -> str:
    """``ok``, ``hang`` or ``bad`` (a wrong status, message or a directory left)."""
    work = Path(tempfile.mkdtemp(prefix="ctrl-c-stress-"))
    try:
        tmpdir = work / "tmp"
        tmpdir.mkdir()
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        argv = [sys.executable, "-X", "faulthandler", "-m", "kvtier", "run"]
        argv += ["--model", str(checkpoint), "--conversations", "3", "--turns", "200"]
        argv += ["--system-tokens", "40", "--user-tokens", "10-30", "--answer-tokens", "3-6"]
        argv += ["--block-size", "4", "--store-policy", store_policy]
        argv += ["--json", str(work / "out.json")]
        proc = subprocess.Popen(
            argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        while not list(tmpdir.glob("kvtier-run-*")) and proc.poll() is None:
            time.sleep(0.02)
        time.sleep(random.random())
        proc.send_signal(getattr(signal, f"SIG{signame}"))
        status, word = STATUS[signame]
        try:
            _, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate()
            dumps.mkdir(parents=True, exist_ok=True)
            (dumps / f"hang-{time.strftime('%H%M%S')}-{proc.pid}.txt").write_text(err)
            return "hang"
        lines = err.splitlines()
        whole = bool(lines) and lines[-1] == f"kvtier run: {word}" and "Traceback" not in err
        left = list(tmpdir.glob("kvtier-run-*"))
        return "ok" if proc.returncode == status and whole and not left else "bad"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--signal", choices=sorted(STATUS), default="INT")
    parser.add_argument("--store-policy", default="eager", help="kvtier run --store-policy")
    parser.add_argument("--limit", type=float, default=30.0, help="seconds a stop may take")
    parser.add_argument("--seed", type=int, default=0, help="seeds the signal times")
    parser.add_argument("--dumps", type=Path, default=Path("ctrl-c-dumps"))
    parser.add_argument(
        "--out", type=Path, help="JSON (default: kvtier-results/ctrl-c-stress-<host>-<time>.json)"
    )
    args = parser.parse_args()
    random.seed(args.seed)
    counts = {"ok": 0, "hang": 0, "bad": 0}
    with tempfile.TemporaryDirectory(prefix="ctrl-c-stress-model-") as where:
        checkpoint = _checkpoint(Path(where))
        for i in range(args.runs):
            counts[_one(checkpoint, args.signal, args.store_policy, args.limit, args.dumps)] += 1
            print(f"run {i + 1}/{args.runs}: {counts}", file=sys.stderr, flush=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = write_result("ctrl-c-stress", config, counts, args.out)
    print(
        f"ctrl-c stress: SIG{args.signal} into {args.runs} runs "
        f"(store policy {args.store_policy}): {counts['hang']} hung, {counts['bad']} ended "
        f"wrongly, {counts['ok']} clean -> {path}"
    )


if __name__ == "__main__":
    main()
