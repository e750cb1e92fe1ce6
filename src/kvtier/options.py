"""Option types and checks shared by every ``kvtier`` command.

Runs in the command's process; pure Python (``check_device`` imports torch). Each
command validates every option before it does any work -- argparse applies the types
below while it parses, and the checks below run first in each command's ``main`` -- so
a typo costs a one-line error, never a model load or a half-finished run.

The argparse types turn kvtier's ``ConfigError`` into argparse's error, which the
``kvtier`` parser prints as one line (``kvtier bench disk: error: argument --total:
...``) and exits 2.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kvtier.config import non_negative_int, positive_int
from kvtier.errors import ConfigError
from kvtier.sizes import parse_byte_list, parse_bytes

T = TypeVar("T")


def _argparse_type(name: str, check: Callable[[str], T]) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return check(text)
        except ConfigError as e:
            message = str(e).split(": ", 1)[1]  # argparse names the option itself
            raise argparse.ArgumentTypeError(message) from None

    parse.__name__ = name
    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError("", f"expected an integer, got {text!r}") from None


size = _argparse_type("size", lambda text: parse_bytes("", text))
"""``--total 64MiB``: one byte size (``kvtier.sizes``)."""

size_list = _argparse_type("size list", lambda text: parse_byte_list("", text))
"""``--sizes 256KiB,1MiB``: comma-separated byte sizes."""

positive = _argparse_type("positive integer", lambda text: positive_int("", _int(text)))
"""``--repeats 5``: an integer > 0."""

non_negative = _argparse_type("integer", lambda text: non_negative_int("", _int(text)))
"""``--store-threshold 0``: an integer >= 0."""


def _positive_ints(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError("", f"give at least one integer, e.g. 1,16,256; got {text!r}")
    return [positive_int("", _int(t)) for t in items]


positive_list = _argparse_type("integer list", _positive_ints)
"""``--blocks 1,16,256``: comma-separated integers > 0."""


def check_device(option: str, device: str | None) -> None:
    """Refuse a torch device this machine does not have (imports torch).

    Raises:
        ConfigError: naming ``option``: an unknown device, or CUDA without CUDA.
    """
    if device is None or device == "auto":
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(option, f"unknown device {device!r}; use cpu or cuda") from None
    if dev.type == "cpu":
        return
    if dev.type != "cuda":
        raise ConfigError(option, f"device {device!r} is not supported; use cpu or cuda")
    if not torch.cuda.is_available():
        why = "torch is a CPU build" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(option, f"{device!r} asked but CUDA is not available ({why}); use cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            option, f"{device!r} asked but only {torch.cuda.device_count()} CUDA device(s)"
        )


def writable_directory(option: str, path: Path, *, create: bool) -> Path:
    """Check that ``path`` is a directory kvtier can write files in.

    Args:
        option: named in errors.
        path: the directory.
        create: make it (and missing parents, mode 0700) when it does not exist;
            otherwise a missing directory is an error.

    Raises:
        ConfigError: naming ``option``: missing (without ``create``), not a directory,
            cannot be created, or files cannot be created in it.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(option, f"{path} is not a directory; give a directory")
    if not path.exists():
        if not create:
            raise ConfigError(option, f"{path} does not exist; create it or give another")
        try:
            path.mkdir(parents=True, mode=0o700)
        except OSError as e:
            raise ConfigError(
                option,
                f"cannot create {path} ({e.strerror}); give a directory on a writable file system",
            ) from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".kvtier-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            option, f"cannot write in {path} ({e.strerror}); give a writable directory"
        ) from None
    return path
