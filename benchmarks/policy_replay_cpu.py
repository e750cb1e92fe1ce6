"""CPU seconds of a policy's replay of a few of issue 14's cells (best of ``--runs``).

A replay's wall time on a shared machine swings with the load; its process CPU time
much less. To compare two trees, run this once with each on ``PYTHONPATH``,
alternating, and compare the figures cell by cell. Run from the repository root::

    PYTHONPATH=src nice python benchmarks/policy_replay_cpu.py leader \
        synthetic:0.10 agents_seed1:0.10 chat_seed1:0.05 mixed_seed3:0.05

Prints one JSON line: the policy, the kvtier tree it imported, the load average, and
per cell the capacity, hit blocks and best CPU seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policy_cells as pc

import kvtier
from kvtier.sim.replay import replay


def main() -> None:
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--runs=")]
    runs = int(next((a[7:] for a in sys.argv[1:] if a.startswith("--runs=")), "3"))
    policy, cells = args[0], args[1:]
    out: dict[str, object] = {"policy": policy, "tree": str(Path(kvtier.__file__).parents[1])}
    for cell in cells:
        workload, share = cell.split(":")
        trace = pc._trace(workload)
        capacity = round(float(share) * trace.num_distinct_blocks)
        best = float("inf")
        hits = 0
        for _ in range(runs):
            start = time.process_time()
            hits = replay(trace, capacity, policy).ratios.hit_blocks
            best = min(best, time.process_time() - start)
        out[cell] = {"capacity": capacity, "hit_blocks": hits, "cpu_s": round(best, 3)}
    out["load_average"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
