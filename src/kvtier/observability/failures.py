"""Failed operations of a tier: why (a short reason), counted, and logged once.

Runs in the engine's thread (it reads finished jobs' results); pure Python. A tier
that cannot be reached or written is never silent: the first failure of each
``(tier, reason)`` is logged as a warning -- with where the tier is (a disk path, or
a Redis URL without its credentials) and the error -- and every failure is counted
in blocks by tier, operation and reason (``OffloadStats.failures``, the report of
``kvtier run`` and ``kvtier_failed_blocks_total``). Later failures of the same kind
are counted, not logged: an outage of hours must not fill the log.

A reason is one word from a small fixed set, so it can be a metric label:

============  =============================================================
``unreachable``  the store did not answer (refused, timed out, or backing off)
``refused``      the store answered no (e.g. Redis out of memory)
``full``         the disk has no space (``ENOSPC``/``EDQUOT``) or the tier's
                 byte budget is used up
``unwritable``   permission denied or a read-only file system
``miss``         the block is no longer there (evicted, expired, deleted)
``corrupt``      the bytes failed verification (the block was dropped)
``undecryptable``  a sealed block that does not open with this engine's keys,
                 model and block key (another key or none, moved, forged), or
                 a block of the other format (sealed where no key is set,
                 plaintext where one is); dropped
``shut_down``    the handler was already shut down
``invalid``      the job was malformed (a bug; see the log)
``error``        anything else (the first message is logged)
============  =============================================================
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

from kvtier.blocks import Medium

logger = logging.getLogger(__name__)

REASONS = (
    "unreachable",
    "refused",
    "full",
    "unwritable",
    "miss",
    "corrupt",
    "undecryptable",
    "shut_down",
    "invalid",
    "error",
)

# First match wins; matched against the error text of a failed job.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, re.compile(pattern, re.IGNORECASE))
    for reason, pattern in (
        ("shut_down", r"handler is shut down"),
        ("invalid", r"invalid transfer spec|malformed transfer spec|no handler for"),
        ("undecryptable", r"undecryptable"),
        ("corrupt", r"failed verification|checksum|corrupt|truncated"),
        ("full", r"\[Errno (28|122)\]|No space left|quota exceeded|tier full"),
        ("unwritable", r"\[Errno (1|13|30)\]|Permission denied|Read-only file system"),
        ("refused", r"values? refused|\bOOM\b|maxmemory"),
        (
            "unreachable",
            r"unhealthy|ConnectionError|TimeoutError|Connection refused|timed out|"
            r"Connection reset|Error \d+ connecting",
        ),
        ("miss", r"missed|not on disk|not stored|No such file"),
    )
)


def classify(error: str | None) -> str:
    """The reason (one of ``REASONS``) for a failed job's ``error`` text."""
    for reason, pattern in _PATTERNS:
        if error and pattern.search(error):
            return reason
    return "error"


@dataclass(frozen=True, slots=True, order=True)
class FailureKey:
    """What failed: ``op`` (``"load"`` or ``"store"``) on ``tier`` for ``reason``."""

    tier: Medium
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.tier} {self.op} {self.reason}"


_DEPTH = {Medium.GPU: 0, Medium.CPU: 1, Medium.DISK: 2, Medium.REMOTE: 3}


def job_tier(src: Medium, dst: Medium) -> tuple[Medium, str]:
    """The tier a job between ``src`` and ``dst`` loads from or stores into.

    It is the medium farther from the GPU: CPU->GPU loads from CPU, GPU->CPU stores
    into CPU, CPU->DISK stores into DISK, REMOTE->CPU loads from REMOTE.
    """
    tier = max(src, dst, key=_DEPTH.__getitem__)
    return tier, ("store" if tier == dst else "load")


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def redact_url(url: str) -> str:
    """``url`` without its user name and password (``redis://:pw@h:1/0`` -> ``redis://h:1/0``)."""
    return _USERINFO.sub("", url)


class FailureLog:
    """Counts failed blocks by ``FailureKey`` and logs each ``(tier, reason)`` once.

    Thread-safe (a lock around the counts), though the engine records from one thread.

    Args:
        where: how to name each tier in a log line, e.g. ``{DISK: "/data/kv"}``
            (URLs are redacted here).
    """

    def __init__(self, where: dict[Medium, str] | None = None) -> None:
        self.where = {m: redact_url(w) for m, w in (where or {}).items()}
        self._lock = threading.Lock()
        self._counts: dict[FailureKey, int] = {}
        self._logged: set[tuple[Medium, str]] = set()

    def record(self, tier: Medium, op: str, error: str | None, blocks: int) -> FailureKey:
        """Count ``blocks`` failed for ``error``; log if its ``(tier, reason)`` is new."""
        key = FailureKey(tier, op, classify(error))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + blocks
        self.log_once(tier, key.reason, f"{op} of {blocks} block(s) failed: {error}")
        return key

    def log_once(self, tier: Medium, reason: str, detail: str) -> bool:
        """Log ``detail`` as a warning unless ``(tier, reason)`` was logged; whether it was."""
        with self._lock:
            if (tier, reason) in self._logged:
                return False
            self._logged.add((tier, reason))
        where = self.where.get(tier)
        logger.warning(
            "%s tier%s: %s: %s (logged once; every failure is counted in the stats and "
            "kvtier_failed_blocks_total)",
            tier,
            f" at {where}" if where else "",
            reason.replace("_", " "),
            _USERINFO.sub("", detail),
        )
        return True

    def take(self) -> dict[FailureKey, int]:
        """The counts since the last call (then zero)."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts
