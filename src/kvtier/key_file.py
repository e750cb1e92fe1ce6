"""The encryption key file (``encryption_key_file``): read, checked, each key named by an id.

Runs anywhere; pure Python (``hashlib``). ``OffloadingConfig`` reads the file once to
validate it before anything starts; the disk and remote tiers read it again when they
open (``kvtier.tiers``) and seal their blocks with it (``kvtier.media.sealing``). The
keys themselves are never kept in the configuration, never in a repr, never logged:
only their ids are shown.

The file holds one key or several, each 32 bytes:

* exactly 32 bytes: one raw key (``head -c 32 /dev/urandom > kv.key``);
* otherwise text, one key per line as 64 hex digits; blank lines and lines starting
  with ``#`` are skipped.

The first key seals every block written; every key opens blocks sealed with it. So a
new key is put first and the old ones kept after it for as long as blocks they sealed
may still be read (``docs/security.md``).

A key's id is the first 8 bytes of ``SHA-256("kvtier/key-id/v1" || key)``: stored in
each sealed block's header so a reader picks the right key without trying each. It
says which key sealed a block; it reveals nothing of the key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field

from kvtier.errors import ConfigError

KEY = "encryption_key_file"
KEY_BYTES = 32
KEY_ID_BYTES = 8
_ID_TAG = b"kvtier/key-id/v1"
_HEX_LINE = re.compile(r"[0-9a-fA-F]{64}")

logger = logging.getLogger(__name__)
_warned: set[str] = set()  # key files already reported readable by others


@dataclass(frozen=True, slots=True)
class EncryptionKey:
    """One 32-byte key and its id (``repr`` shows the id only).

    Attributes:
        key_id: the first 8 bytes of ``SHA-256("kvtier/key-id/v1" || secret)``.
        secret: the key's 32 bytes.
    """

    key_id: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def of(cls, secret: bytes) -> EncryptionKey:
        """The key ``secret`` (32 bytes) with its id.

        Raises:
            ValueError: ``secret`` is not 32 bytes.
        """
        if len(secret) != KEY_BYTES:
            raise ValueError(f"an encryption key is {KEY_BYTES} bytes, got {len(secret)}")
        return cls(hashlib.sha256(_ID_TAG + secret).digest()[:KEY_ID_BYTES], secret)


def read_key_file(path: str | os.PathLike[str]) -> tuple[EncryptionKey, ...]:
    """The keys of the file at ``path``, the one that seals new blocks first.

    A file other users may read is accepted with a warning (once per path and
    process): the key is then no secret from them.

    Raises:
        ConfigError: (key ``encryption_key_file``) the file cannot be read, holds no
            key, a line that is not 64 hex digits, or the same key twice.
    """
    shown = os.fspath(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(1 << 16)
    except OSError as e:
        raise ConfigError(KEY, f"cannot read {shown} ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(KEY, f"{shown} is not a regular file")
    if mode & 0o077 and shown not in _warned:
        _warned.add(shown)
        logger.warning(
            "encryption key file %s can be read by other users (mode %o); chmod 600 it",
            shown,
            stat.S_IMODE(mode),
        )
    if len(data) != KEY_BYTES and len(data.rstrip(b"\r\n")) == KEY_BYTES:
        raise ConfigError(
            KEY,
            f"{shown} is {len(data)} bytes: a raw key is exactly {KEY_BYTES}, with no "
            "newline after it (head -c 32 /dev/urandom > FILE), or 64 hex digits",
        )
    keys = [EncryptionKey.of(data)] if len(data) == KEY_BYTES else _hex_keys(shown, data)
    ids = [k.key_id for k in keys]
    for i, key_id in enumerate(ids):
        if key_id in ids[:i]:
            raise ConfigError(KEY, f"{shown}: key {i + 1} repeats key {ids.index(key_id) + 1}")
    return tuple(keys)


def _hex_keys(shown: str, data: bytes) -> list[EncryptionKey]:
    what = (
        f"hold one raw {KEY_BYTES}-byte key, or keys of 64 hex digits, one per line "
        "(head -c 32 /dev/urandom | xxd -p -c 64)"
    )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(KEY, f"{shown} is {len(data)} bytes of binary; it must {what}") from None
    keys = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not _HEX_LINE.fullmatch(line):
            # the line may be a key with a typo: its length is shown, never the line
            raise ConfigError(
                KEY,
                f"{shown} line {n} is not 64 hex digits ({len(line)} characters); it must {what}",
            )
        keys.append(EncryptionKey.of(bytes.fromhex(line)))
    if not keys:
        raise ConfigError(KEY, f"{shown} holds no key; it must {what}")
    return keys
