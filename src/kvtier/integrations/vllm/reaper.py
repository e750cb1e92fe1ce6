"""Removes a region file once no process holds it: ``python reaper.py PATH INODE``.

Runs as a small process of its own, detached from vLLM's (its own session), started
by the process that creates a region (``region.HostRegion.open``). Every process that
maps the region holds a shared ``flock`` on it, which the kernel drops when the
process dies, however it dies: vLLM's server SIGKILLs its engine processes right
after their SIGTERM, so no code of theirs can be counted on to run. This process waits
for an exclusive lock -- granted once every holder is gone -- and unlinks the file if
the name still refers to the region it was started for (``INODE``).

Standard library only, and run as a script (not ``-m``): it must not import vLLM,
torch or kvtier, so it costs a few MiB for the engine's lifetime. It forks once and
the parent exits at once, so the process that started it has no child to reap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys


def reap(path: str, inode: int) -> None:
    """Wait until no process holds ``path``'s region, then unlink it if still there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if os.fstat(fd).st_ino != inode:
            return  # already replaced by another region of the same name
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)
    finally:
        os.close(fd)


def main() -> None:
    path, inode = sys.argv[1], int(sys.argv[2])
    if os.fork():
        os._exit(0)  # the starter's child exits now; the grandchild waits
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(devnull, stream)
    reap(path, inode)


if __name__ == "__main__":
    main()
