"""Two source trees side by side, for the ``*_ab`` benchmark scripts: rounds of child
processes, one per tree and round, the trees' order alternating round by round (a
process imports one ``kvtier``, the one its ``PYTHONPATH`` names).

A child prints one line ``RESULT <json>``; ``alternate`` returns every round's parsed
result and the 1-minute load average before the first and after every child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def commit_of(src: str) -> str:
    """The short commit of the git tree holding ``src`` ("" for an unpacked archive)."""
    return subprocess.run(
        ["git", "-C", src, "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def alternate(
    script: str, child_args: list[str], base_src: str, new_src: str, rounds: int
) -> tuple[list[dict[str, Any]], list[float]]:
    """Run ``script --child *child_args`` once per tree per round.

    Returns ``([{"tree", "round", "cases"}, ...], load averages)``.
    """
    out: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    for k in range(rounds):
        for tree in ("base", "new") if k % 2 == 0 else ("new", "base"):
            env = dict(os.environ, PYTHONPATH=base_src if tree == "base" else new_src)
            proc = subprocess.run(
                [sys.executable, script, "--child", *child_args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            out.append({"tree": tree, "round": k, "cases": json.loads(line[7:])})
            loads.append(os.getloadavg()[0])
            print(f"round {k} {tree} done, load {loads[-1]:.2f}", flush=True)
    return out, loads
