"""What this machine has -- available memory, free disk -- and sizes checked against it.

Runs wherever tiers are sized (``OffloadingSpec``, ``kvtier run``); pure Python, reads
``/proc/meminfo``, the cgroup's memory limit and ``statvfs``. A tier's size is checked
here *before* anything is allocated or created, so that ``cpu_bytes_to_use: "1TiB"`` or
``disk_bytes_to_use: "100TiB"`` ends at once with a ``ConfigError`` that names the key,
what was asked, what the machine has and what to change -- never an out-of-memory kill
or a full disk minutes later. Where a figure cannot be read (not Linux), the size is
not checked here; the allocation itself still fails cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.sizes import format_bytes

_log = logging.getLogger(__name__)

_CGROUP = Path("/sys/fs/cgroup")


def available_memory() -> int | None:
    """Bytes that can be allocated without swapping: ``MemAvailable``, within the cgroup.

    ``None`` when ``/proc/meminfo`` cannot be read.
    """
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:  # cgroup v2: a container's limit can be far below the machine's memory
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit != "max":
            used = int((_CGROUP / "memory.current").read_text())
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def existing_ancestor(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_disk(path: Path) -> int | None:
    """Bytes an unprivileged writer can still use on the file system holding ``path``.

    ``path`` need not exist yet (its nearest existing parent is asked). ``None`` when
    it cannot be asked.
    """
    try:
        vfs = os.statvfs(existing_ancestor(path))
    except OSError:
        return None
    return vfs.f_bavail * vfs.f_frsize


def check_memory(key: str, asked: int) -> None:
    """Refuse a host-memory size this machine cannot give now.

    Raises:
        ConfigError: naming ``key``, when ``asked`` exceeds the available memory.
    """
    available = available_memory()
    if available is not None and asked > available:
        raise ConfigError(
            key,
            f"{format_bytes(asked)} asked but this machine has {format_bytes(available)} "
            f"of memory available; lower {key}",
        )


def check_disk(key: str, path: Path, asked: int, tier_dir: Path | None = None) -> None:
    """Refuse a disk size the file system holding ``path`` cannot give.

    A first start (the tier holds nothing yet) must find the space free: a shortfall
    is a configuration mistake. A restart over a tier that already holds blocks may
    find the disk filled by others meanwhile: that is a fault, not a configuration,
    so the engine starts (with a warning) and its disk stores fail until space
    returns -- unless ``asked`` exceeds the whole file system, which no restart fixes.

    Args:
        key: the size's key or option, named in the error.
        path: the tier's directory (need not exist yet).
        asked: the tier's capacity in bytes.
        tier_dir: where the tier keeps its files, when it may hold some already (a
            restart): they count as available. Only walked when free space is short.

    Raises:
        ConfigError: naming ``key``, when ``asked`` exceeds free space plus what the
            tier already holds on a first start, or the file system's size.
    """
    free = free_disk(path)
    if free is None or asked <= free:
        return
    held = 0 if tier_dir is None else bytes_under(tier_dir)
    if asked <= free + held:
        return
    where = existing_ancestor(path)
    vfs = os.statvfs(where)
    size = vfs.f_blocks * vfs.f_frsize
    if held and asked <= size:
        _log.warning(
            "%s: %s asked at %s but only %s free plus %s this tier holds: starting; "
            "disk stores fail until space is freed",
            key,
            format_bytes(asked),
            where,
            format_bytes(free),
            format_bytes(held),
        )
        return
    kept = f" plus {format_bytes(held)} this tier already holds" if held else ""
    raise ConfigError(
        key,
        f"{format_bytes(asked)} asked but the file system of {where} has "
        f"{format_bytes(free)} free{kept}; lower {key} or free space",
    )


def bytes_under(path: Path) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed while we walk
                total += os.lstat(os.path.join(root, name)).st_size
    return total
