"""``RequestKeys``: each request's keys per KV cache group, in prefix order.

Runs in vLLM's scheduler process, on the scheduler thread; pure Python (no vLLM
import). vLLM shows the manager one key at a time, but it records, in each request's
``ReqContext``, every offload key it has made for the request with the token position
where the key's block ends. Read in that order and split by the key's group (its last
``GROUP_SUFFIX`` bytes), they are the request as kvtier's policies expect it, once per
KV cache group: the whole prefix, the blocks vLLM's GPU cache served included.

vLLM has no public accessor for the whole record, only one position per key
(``get_offload_key_position``), so it is read from the context's
``_offload_key_positions`` dict, a pinned exception to "public APIs only": the vLLM
suites test that both supported versions fill it, and without it (another vLLM) a
request is the keys vLLM looked up, in the order it looked them up.

A context's keys are appended in position order for each KV cache group and never
change once recorded, so a group's keys only grow: the new ones are appended.

Where vLLM's own cache stopped. vLLM looks a request up group by group, full-attention
groups first, each from the first block its GPU cache did not serve; windowed groups
(sliding window, chunked local attention, Mamba state) after them, from the right.
The request's first lookup therefore starts where vLLM's cache stopped, for a model
with a full-attention group, and ``admit`` uses that token position for every group
of the request: the blocks before it were served by vLLM, the ones from it are the
request's lookups (and what kvtier asks Redis about).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.blocks import BlockHash

logger = logging.getLogger(__name__)

GROUP_SUFFIX = 4
"""Bytes of the KV cache group index at the end of a vLLM offload key."""


def group_of(key: bytes) -> int:
    """The KV cache group index of a vLLM offload key."""
    return int.from_bytes(key[-GROUP_SUFFIX:], "big")


@dataclass(slots=True)
class Request:
    """One request's keys in one KV cache group, in prefix order.

    Attributes:
        keys: the keys, prefix order.
        ends: the token position where each key's block ends (``None`` where vLLM
            recorded none: a key only looked up).
        admitted: whether the policies have been shown the group's keys.
        first: how many leading keys vLLM's own cache served (where its lookups of a
            full-attention group began; set at admission).
        windowed: whether vLLM looks the group up from the right: a windowed group
            (its first lookup was past where vLLM's own cache stopped, or a later one
            came before it; see ``looked_up``).
        first_looked: where in ``keys`` the group's first lookup was.
        promoted: keys promoted into the CPU tier for this request. One of them gone
            from the CPU tier again before vLLM loaded it means the tier cannot hold
            the request's blocks at once: promoting it again would evict another of
            the request's blocks, and so on, a lookup after the other.
    """

    keys: list[BlockHash] = field(default_factory=list)
    ends: list[int | None] = field(default_factory=list)
    admitted: bool = False
    first: int = 0
    windowed: bool = False
    first_looked: int = 0
    promoted: set[BlockHash] = field(default_factory=set)
    _index: dict[BlockHash, int] = field(default_factory=dict)

    def index(self, key: BlockHash) -> int:
        """Where ``key`` is in ``keys`` (it is there: ``RequestKeys.of`` adds it)."""
        return self._index[key]

    def start(self, key: BlockHash) -> int | None:
        """The token position where ``key``'s block starts, if vLLM recorded it."""
        i = self._index[key]
        return 0 if i == 0 else self.ends[i - 1]

    def before(self, position: int) -> int:
        """How many leading keys end at or before token ``position``."""
        n = 0
        for end in self.ends:
            if end is None or end > position:
                break
            n += 1
        return n

    def looked_up(self, key: BlockHash) -> bool:
        """Note a lookup of ``key`` after the group's first; whether it showed the group
        windowed just now (a lookup left of the first: vLLM scans it from the right,
        which it does for every group when the model has no full-attention one)."""
        if self.windowed or self.index(key) >= self.first_looked:
            return False
        self.windowed = True
        return True

    def _append(self, key: BlockHash, end: int | None) -> None:
        """Append ``key`` (ending at token ``end``) unless it is there. A recorded key
        ending before the last one is not a block of the prefix (vLLM's partial-tail
        keys, recorded when looked up): it joins only if it is looked up itself."""
        last = self.ends[-1] if self.ends else None
        if end is not None and last is not None and end <= last:
            return
        if key not in self._index:
            self._index[key] = len(self.keys)
            self.keys.append(key)
            self.ends.append(end)


@dataclass(slots=True)
class _Record:
    """What has been read of one request's context: its groups, and where vLLM's own
    cache stopped (set at the request's first lookup)."""

    groups: dict[bytes, Request] = field(default_factory=dict)
    served: int | None = None
    read: int = 0  # entries of the context's record already read

    def group(self, suffix: bytes) -> Request:
        request = self.groups.get(suffix)
        if request is None:
            request = self.groups[suffix] = Request()
        return request


class RequestKeys:
    """The keys of the requests the scheduler is serving, by request id and group."""

    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}
        self._warned = False

    def of(self, req_context: Any, key: BlockHash) -> Request:
        """The keys of ``req_context``'s request in ``key``'s group, ``key`` among them."""
        record = self._read(req_context)
        request = record.group(bytes(key)[-GROUP_SUFFIX:])
        request._append(key, None)
        return request

    def groups(self, req_context: Any) -> list[Request]:
        """Every group's keys of ``req_context``'s request read so far."""
        return list(self._read(req_context).groups.values())

    def admit(self, req_context: Any, key: BlockHash) -> tuple[Request, int] | None:
        """At the first lookup of ``key``'s group in this request: the group's keys and
        how many of them lead up to where vLLM's own cache stopped (see the module
        doc); ``None`` when the group was admitted before.

        Without recorded positions the group's served keys are those before ``key``.
        Sets ``windowed`` (see ``Request``).
        """
        request = self.of(req_context, key)
        if request.admitted:
            return None
        request.admitted = True
        request.first_looked = request.index(key)
        record = self._records[req_context.req_id]
        if record.served is None:
            record.served = request.start(key)
        if record.served is None:
            return request, request.index(key)
        first = request.before(record.served)
        request.windowed = request.first_looked > first
        return request, first

    def _read(self, req_context: Any) -> _Record:
        record = self._records.get(req_context.req_id)
        if record is None:
            record = self._records[req_context.req_id] = _Record()
        positions = getattr(req_context, "_offload_key_positions", None)
        if isinstance(positions, Mapping):
            if len(positions) > record.read:
                for recorded in itertools.islice(positions, record.read, None):
                    raw = bytes(recorded)
                    record.group(raw[-GROUP_SUFFIX:])._append(
                        BlockHash(raw), int(positions[recorded])
                    )
                record.read = len(positions)
        elif not self._warned:
            self._warned = True
            logger.warning(
                "kvtier: this vLLM's request context records no offload keys; the "
                "policies see each request as the keys vLLM looks up"
            )
        return record

    def forget(self, req_context: Any) -> None:
        """The request finished: its keys are no longer needed."""
        self._records.pop(req_context.req_id, None)

    def __len__(self) -> int:
        return len(self._records)
