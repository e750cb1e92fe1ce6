"""``kvtier bench remote`` with the store path's ``SO_RCVLOWAT`` on or off, for A/B runs.

Run from the repository root: ``PYTHONPATH=src python benchmarks/remote_bench_rcvlowat_ab.py
on|off [kvtier bench remote options]``. ``off`` makes
``kvtier.media.remote_values.replies_awaited`` a no-op (the store path before it);
alternate ``on`` and ``off`` runs and compare each run's ratios (``docs/remote.md``).
"""

from __future__ import annotations

import contextlib
import sys

from kvtier.cli import main
from kvtier.media import remote_values

if __name__ == "__main__":
    if sys.argv[1] == "off":
        remote_values.replies_awaited = lambda sock, nbytes: contextlib.nullcontext()  # type: ignore[assignment]
    elif sys.argv[1] != "on":
        raise SystemExit("first argument: on or off")
    sys.exit(main(["bench", "remote", *sys.argv[2:]]))
