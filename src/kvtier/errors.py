"""Every error kvtier raises on purpose, in one place.

::

    KvtierError                 base: catch this to catch anything kvtier raises on purpose
    ├── ConfigError             a configuration value is missing, unknown or invalid;
    │                           the message names the key and says what to change
    ├── CapacityError           a request can never fit (bigger than the whole tier)
    ├── TransferError           a transfer could not be submitted or its bytes are bad
    │   └── IntegrityError      stored bytes failed verification (a miss, never served)
    ├── ProtocolError           a caller broke the OffloadingManager / handler protocol
    │   │                       (load of a block that is not ready, unpin below zero, ...)
    │   └── TransferSpecError   a transfer spec is malformed: media the handler does not
    │                           move, counts that differ, an id out of range
    └── TraceError              a workload trace is malformed (names the line)

``assert`` is used only for internal invariants that no user input can reach.
Anything a user, a disk or a network can cause raises one of these, or is reported
as a failed job.
"""

from __future__ import annotations


class KvtierError(Exception):
    """Base class of every error kvtier raises on purpose."""


class ConfigError(KvtierError, ValueError):
    """A configuration value is missing, unknown or invalid.

    Attributes:
        key: the configuration key at fault (dotted for nested keys).
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key {key!r}: {message}")


class CapacityError(KvtierError):
    """A request can never fit in a tier, however much is evicted."""


class TransferError(KvtierError):
    """A transfer could not be submitted, or it failed."""


class IntegrityError(TransferError):
    """Stored bytes failed verification; the block is treated as a miss.

    Attributes:
        reason: what failed, as a short stable word (``"checksum_mismatch"``, ...;
            see ``kvtier.media.block_format.Corruption``), or ``None``.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        self.reason = reason
        super().__init__(message)


class ProtocolError(KvtierError):
    """A caller broke a protocol: the message says which call and which block."""


class TransferSpecError(ProtocolError, ValueError):
    """A transfer spec is malformed (wrong media or spec types for the handler, counts
    that differ, a block id out of range, a destination written twice). Handlers
    refuse such a job and report it failed; it never reaches a copy."""


class TraceError(KvtierError, ValueError):
    """A workload trace is malformed.

    Attributes:
        line: 1-based line number in the trace file, when known.
    """

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
