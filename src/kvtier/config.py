"""Offloading configuration: one dict in, one frozen, validated object out.

Runs anywhere; pure Python. ``OffloadingConfig.from_dict`` is the only way a user's
settings enter kvtier: every key is checked once, here, and a bad one raises
``ConfigError`` naming the key and saying what to change. The frozen result is passed
down as it is; nothing copies or mutates it.

Keys (see ``docs/configuration.md``):

========================  =========================================================
``cpu_bytes_to_use``      host memory for the CPU tier: bytes, or "8GiB" / "512MB"
                          (required)
``block_size``            tokens per offloaded block (a multiple of the engine's
                          GPU block size; default 16)
``eviction_policy``       a registered policy name (default ``"lru"``)
``store_threshold``       store a block only after N lookups (0 = store all)
``enable_events``         record stored/removed events (default true)
``hash_algorithm``        block key digest: ``"sha256"`` (default) or ``"blake2b"``
``store_policy``          when blocks are stored: ``"eager"`` (each block once it is
                          full, default), ``"on_evict"`` (when the GPU prefix cache
                          evicts it), ``"reuse"`` (only blocks seen before)
``max_pending_writes``    write-through queue bound, blocks per secondary tier
                          (default 1024; beyond it writes are skipped and counted)
``disk_path``             directory of the disk tier (none: no disk tier)
``disk_bytes_to_use``     the disk tier's hard byte capacity (required with a path)
``disk_eviction_policy``  the disk tier's policy (default ``"lru"``)
``disk_io_threads``       disk reads/writes in flight per direction (default 4)
``disk_fsync``            fsync each block before it becomes visible (default false)
``disk_direct_io``        ``"auto"`` (default), true or false
``remote_url``            Redis/Valkey URL of a store shared by engines (none: no
                          remote tier); ``redis://``, ``rediss://`` or ``unix://``,
                          with an ACL user (``redis://user@host``) if needed
``remote_cluster``        the URL names a node of a Redis Cluster (default false)
``remote_timeout_s``      connect/read timeout, seconds (default 1.0)
``remote_password_env``   environment variable holding the password (default
                          ``KVTIER_REDIS_PASSWORD``; else the URL's, if it has one)
``remote_io_threads``     connections per direction, one I/O thread each way (default 2)
``remote_ttl_s``          expire values this long after writing (default: never)
``remote_tls_ca_file``    CA bundle for ``rediss://`` (default: the system's)
``remote_tls_cert_file``  client certificate (PEM) for ``rediss://`` (default: none)
``remote_tls_key_file``   its private key, if not in the certificate file
``remote_index_blocks``   remote blocks this engine remembers (default 1,000,000)
``remote_backoff_s``      first wait after a failure before retrying (default 0.5)
``encryption_key_file``   a file of 32-byte keys: disk and remote blocks are sealed
                          with AES-256-GCM (``docs/security.md``; default: none)
========================  =========================================================
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from kvtier.errors import ConfigError
from kvtier.key_file import read_key_file
from kvtier.keys import HASH_ALGORITHMS
from kvtier.scheduler.policies import POLICIES
from kvtier.sizes import format_bytes, parse_bytes

DEFAULT_EVICTION_POLICY = "lru"
"""The CPU tier's policy when ``eviction_policy`` is not given, in every engine (the
reference engine, vLLM's spec, ``kvtier run``) and in ``kvtier simulate``: the policy
within 1.5x LRU's scheduler cost that reaches max(LRU, ARC) in the most replayed cells
(``docs/simulate.md``, "The default")."""

__all__ = [
    "DEFAULT_EVICTION_POLICY",
    "STORE_POLICIES",
    "OffloadingConfig",
    "check_known",
    "non_negative_int",
    "parse_bytes",
    "positive_int",
]

STORE_POLICIES = ("eager", "on_evict", "reuse")


def positive_int(key: str, value: object) -> int:
    """``value`` if it is an int > 0 (not a bool).

    Raises:
        ConfigError: naming ``key`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    return value


def non_negative_int(key: str, value: object) -> int:
    """``value`` if it is an int >= 0 (not a bool).

    Raises:
        ConfigError: naming ``key`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(key, f"must be an integer >= 0, got {value!r}")
    return value


def check_known(raw: Mapping[str, Any], known: Sequence[str], what: str = "") -> None:
    """Refuse a key not in ``known``, naming the closest known key.

    Args:
        raw: the user's keys.
        known: every key allowed here.
        what: where the keys are (``"of KvtierDiskTier"``), for the message.

    Raises:
        ConfigError: naming the first unknown key.
    """
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
            where = f" {what}" if what else ""
            raise ConfigError(str(key), f"unknown key{where}; {hint}")


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def _choice(key: str, value: object, choices: list[str]) -> str:
    if value not in choices:
        raise ConfigError(key, f"got {value!r}; choose one of {', '.join(choices)}")
    assert isinstance(value, str)
    return value


def _disk_keys(raw: Mapping[str, Any], get: Callable[[str], object]) -> dict[str, Any]:
    path = raw.get("disk_path")
    size = raw.get("disk_bytes_to_use")
    if path is None:
        if size is not None:
            raise ConfigError("disk_bytes_to_use", "is set but disk_path is not; set both")
        return {}
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError("disk_path", f"must be a directory path, got {path!r}")
    if size is None:
        raise ConfigError("disk_bytes_to_use", "is required with disk_path: the disk tier's size")
    direct = raw.get("disk_direct_io", "auto")
    if direct not in ("auto", True, False):
        raise ConfigError("disk_direct_io", f"must be 'auto', true or false, got {direct!r}")
    return {
        "disk_path": os.fspath(path),
        "disk_bytes_to_use": parse_bytes("disk_bytes_to_use", size),
        "disk_eviction_policy": _choice(
            "disk_eviction_policy", get("disk_eviction_policy"), sorted(POLICIES)
        ),
        "disk_io_threads": positive_int("disk_io_threads", get("disk_io_threads")),
        "disk_fsync": _bool("disk_fsync", get("disk_fsync")),
        "disk_direct_io": None if direct == "auto" else direct,
    }


def _seconds(key: str, value: object, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(key, f"must be a positive number of seconds, got {value!r}")
    return float(value)


def _optional_str(key: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, f"must be a string or null, got {value!r}")
    return value


def _remote_keys(raw: Mapping[str, Any], get: Callable[[str], object]) -> dict[str, Any]:
    url = raw.get("remote_url")
    if url is None:
        given = sorted(k for k in raw if k.startswith("remote_"))
        if given:
            raise ConfigError(given[0], "is set but remote_url is not; set remote_url too")
        return {}
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        shown = urlsplit(url).scheme if isinstance(url, str) else type(url).__name__
        # the URL itself may hold a password: only its scheme is shown
        raise ConfigError("remote_url", f"must be redis://, rediss:// or unix://, got {shown!r}")
    return {
        "remote_url": url,
        "remote_cluster": _bool("remote_cluster", get("remote_cluster")),
        "remote_timeout_s": _seconds("remote_timeout_s", get("remote_timeout_s")),
        "remote_password_env": _optional_str("remote_password_env", get("remote_password_env")),
        "remote_io_threads": positive_int("remote_io_threads", get("remote_io_threads")),
        "remote_ttl_s": _seconds("remote_ttl_s", get("remote_ttl_s"), optional=True),
        "remote_tls_ca_file": _optional_str("remote_tls_ca_file", get("remote_tls_ca_file")),
        "remote_tls_cert_file": _optional_str("remote_tls_cert_file", get("remote_tls_cert_file")),
        "remote_tls_key_file": _optional_str("remote_tls_key_file", get("remote_tls_key_file")),
        "remote_index_blocks": positive_int("remote_index_blocks", get("remote_index_blocks")),
        "remote_backoff_s": _seconds("remote_backoff_s", get("remote_backoff_s")),
    }


def _key_file(raw: Mapping[str, Any]) -> dict[str, Any]:
    path = raw.get("encryption_key_file")
    if path is None:
        return {}
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError("encryption_key_file", f"must be a file path, got {path!r}")
    if raw.get("disk_path") is None and raw.get("remote_url") is None:
        raise ConfigError(
            "encryption_key_file",
            "is set but neither disk_path nor remote_url is: only the disk and remote "
            "tiers are sealed",
        )
    read_key_file(path)  # it must hold valid keys now, not when a tier opens
    return {"encryption_key_file": os.fspath(path)}


SHARED_TIER_KEYS = ("encryption_key_file",)
"""Keys every secondary tier takes besides its own prefix's (``for_tier``)."""


@dataclass(frozen=True, slots=True)
class OffloadingConfig:
    """The validated offloading configuration. Build it with ``from_dict``."""

    cpu_bytes_to_use: int
    block_size: int = 16
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    store_threshold: int = 0
    enable_events: bool = True
    hash_algorithm: str = "sha256"
    store_policy: str = "eager"
    max_pending_writes: int = 1024
    disk_path: str | None = None
    disk_bytes_to_use: int | None = None
    disk_eviction_policy: str = "lru"
    disk_io_threads: int = 4
    disk_fsync: bool = False
    disk_direct_io: bool | None = None
    remote_url: str | None = None
    remote_cluster: bool = False
    remote_timeout_s: float = 1.0
    remote_password_env: str | None = "KVTIER_REDIS_PASSWORD"
    remote_io_threads: int = 2
    remote_ttl_s: float | None = None
    remote_tls_ca_file: str | None = None
    remote_tls_cert_file: str | None = None
    remote_tls_key_file: str | None = None
    remote_index_blocks: int = 1_000_000
    remote_backoff_s: float = 0.5
    encryption_key_file: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OffloadingConfig:
        """Validate a user's settings.

        Raises:
            ConfigError: a key is unknown (with the closest known key), missing or
                invalid; the message names the key and says what to change.
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("<root>", f"expected a mapping of keys, got {type(raw).__name__}")
        check_known(raw, [f.name for f in fields(cls)])
        if "cpu_bytes_to_use" not in raw:
            raise ConfigError(
                "cpu_bytes_to_use", "is required: how much host memory the CPU tier may use"
            )
        defaults = cls.__dataclass_fields__

        def get(key: str) -> object:
            return raw.get(key, defaults[key].default)

        return cls(
            cpu_bytes_to_use=parse_bytes("cpu_bytes_to_use", raw["cpu_bytes_to_use"]),
            block_size=positive_int("block_size", get("block_size")),
            eviction_policy=_choice("eviction_policy", get("eviction_policy"), sorted(POLICIES)),
            store_threshold=non_negative_int("store_threshold", get("store_threshold")),
            enable_events=_bool("enable_events", get("enable_events")),
            hash_algorithm=_choice("hash_algorithm", get("hash_algorithm"), list(HASH_ALGORITHMS)),
            store_policy=_choice("store_policy", get("store_policy"), list(STORE_POLICIES)),
            max_pending_writes=positive_int("max_pending_writes", get("max_pending_writes")),
            **_disk_keys(raw, get),
            **_remote_keys(raw, get),
            **_key_file(raw),
        )

    @classmethod
    def for_tier(cls, tier: str, prefix: str, raw: Mapping[str, Any]) -> OffloadingConfig:
        """Validate the keys of one secondary tier on its own (``disk_*`` or ``remote_*``,
        under another engine's CPU tier): only keys with ``prefix`` are allowed, and
        ``SHARED_TIER_KEYS`` (``encryption_key_file``).

        Raises:
            ConfigError: a key is unknown for ``tier`` or invalid (named).
        """
        known = [f.name for f in fields(cls) if f.name.startswith(prefix)]
        check_known(raw, sorted([*known, *SHARED_TIER_KEYS]), f"of {tier}")
        return cls.from_dict({"cpu_bytes_to_use": 1, **raw})

    def num_cpu_blocks(self, bytes_per_block: int) -> int:
        """How many offloaded blocks of ``bytes_per_block`` fit in ``cpu_bytes_to_use``.

        Raises:
            ConfigError: not even one block fits.
        """
        n = self.cpu_bytes_to_use // bytes_per_block
        if n < 1:
            raise ConfigError(
                "cpu_bytes_to_use",
                f"{format_bytes(self.cpu_bytes_to_use)} holds no block of "
                f"{format_bytes(bytes_per_block)}; give at least {bytes_per_block} bytes",
            )
        return n
