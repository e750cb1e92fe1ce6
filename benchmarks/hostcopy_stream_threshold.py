"""Non-temporal stores from 1 MiB or above N MiB, in the bench's own sequence (CPU).

Run from the repository root with ``PYTHONPATH=src``: ``python
benchmarks/hostcopy_stream_threshold.py PAGE BLOCKS ROUNDS [N]``. One process; each
round runs ``kvtier bench transfer``'s case (``run_transfer_bench``: plain, plain1,
gather, g2c, c2g, both, 5 repeats, random and contiguous ids) once with
``rowcopy.STREAM_MIN_BYTES`` at 1 MiB and once just above N MiB (default 1), the
order alternating; prints the medians (us) of g2c, c2g, plain1 and plain over every
case of every round, per threshold. No JSON: the figures quoted in
``docs/worker.md`` are its printed lines.
"""

from __future__ import annotations

import os
import statistics
import sys

from kvtier.bench import transfer
from kvtier.worker import rowcopy

res = {
    1: {"g2c": [], "c2g": [], "plain1": [], "plain": []},
    2: {"g2c": [], "c2g": [], "plain1": [], "plain": []},
}
pages, blocks = [int(sys.argv[1])], [int(sys.argv[2])]
above = int(sys.argv[4]) if len(sys.argv) > 4 else 1
for k in range(int(sys.argv[3])):
    for mib in (1, 2) if k % 2 == 0 else (2, 1):
        rowcopy.STREAM_MIN_BYTES = (1 << 20) if mib == 1 else (above << 20) + 1
        r = transfer.run_transfer_bench(pages, blocks, ids=("random", "contiguous"), repeats=5)
        for c in r["cases"]:
            for key in res[mib]:
                res[mib][key].append(c["seconds"][key] * 1e6)
print("load", os.getloadavg()[0])
for mib, v in res.items():
    print(
        "stream from",
        "1 MiB" if mib == 1 else f"above {above} MiB",
        {k: round(statistics.median(x), 1) for k, x in v.items()},
    )
