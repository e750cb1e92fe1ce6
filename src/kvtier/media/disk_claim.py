"""Claiming a disk tier's fingerprint directory: made private, probed, locked.

One process at a time owns a fingerprint directory: an exclusive ``flock`` on its
``lock`` file, held for as long as the store is open and released by the kernel when the
process dies however it dies, so a restart after a crash finds the directory free and
two engines given the same path are told so at start instead of sharing the accounting.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.media.direct_io import supports_direct_io
from kvtier.media.disk_layout import LOCK_NAME, fingerprint_dir


def claim(path: Path, fingerprint: bytes, direct_io: bool | None) -> tuple[Path, bool, int]:
    """Make (mode 0700) and lock ``fingerprint``'s directory under ``path``.

    Args:
        path: the cache directory (``disk_path``).
        fingerprint: the model fingerprint digest naming the directory.
        direct_io: ``None`` to use ``O_DIRECT`` where supported, ``True`` to require
            it, ``False`` for buffered I/O.

    Returns:
        The directory, whether ``O_DIRECT`` is to be used, and the locked file's
        descriptor (the caller closes it to release the directory).

    Raises:
        ConfigError: not a writable directory, ``O_DIRECT`` required but unsupported,
            or the directory is held by another process.
    """
    directory = fingerprint_dir(path, fingerprint)
    try:
        for level in (*reversed(directory.parents[:2]), directory):
            level.mkdir(mode=0o700, parents=True, exist_ok=True)  # new levels: 0700
        os.chmod(directory, 0o700)
        has_direct = supports_direct_io(directory)
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ConfigError(
            "disk_path", f"{path} is not a writable directory ({e}); choose another"
        ) from e
    if direct_io and not has_direct:
        os.close(lock_fd)
        raise ConfigError("disk_direct_io", f"the file system at {path} does not support O_DIRECT")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(lock_fd)
        raise ConfigError(
            "disk_path", f"{directory} is in use by another process; give each its own path"
        ) from e
    return directory, has_direct if direct_io is None else direct_io, lock_fd
