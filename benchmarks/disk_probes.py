"""What the disk benchmarks read besides wall time: device requests and CPU seconds.

Shared by ``disk_layout_ab.py``, ``disk_cold_ab.py`` and ``disk_read_pattern.py`` (run
as scripts from the repository root, so this directory is on ``sys.path``).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path


def device_reads(path: Path) -> tuple[int, int]:
    """``(read requests completed, sectors read)`` of the block device holding ``path``."""
    dev = os.stat(path).st_dev
    try:
        fields = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat").read_text().split()
    except OSError:
        return (0, 0)
    return int(fields[0]), int(fields[2])


def cpu_seconds() -> float:
    """CPU seconds this process and its waited-for children have used."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
