"""``RequestKeys``: each request's keys in prefix order, from vLLM's request context.

Runs in vLLM's scheduler process, on the scheduler thread; pure Python (no vLLM
import). vLLM shows the manager one key at a time, but it records, in each request's
``ReqContext``, every offload key it has made for the request with the token position
where the key's block ends. Read in that order, they are the request as kvtier's
policies expect it: the whole prefix, the blocks vLLM's GPU cache served included.

vLLM has no public accessor for the whole record, only one position per key
(``get_offload_key_position``), so it is read from the context's
``_offload_key_positions`` dict, a pinned exception to "public APIs only": the vLLM
suites test that both supported versions fill it, and without it (another vLLM) a
request is the keys vLLM looked up, in the order it looked them up.

A context's keys are appended in position order for each KV cache group and never
change once recorded, so a request's keys only grow: the new ones are appended.
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


@dataclass(slots=True)
class Request:
    """One request's keys (one KV cache group), in prefix order.

    Attributes:
        keys: the keys, prefix order.
        admitted: whether the policies have been shown the request.
        first: where in ``keys`` vLLM's lookups began (the blocks before came from
            its own cache).
        promoted: keys promoted into the CPU tier for this request. One of them gone
            from the CPU tier again before vLLM loaded it means the tier cannot hold
            the request's blocks at once: promoting it again would evict another of
            the request's blocks, and so on, a lookup after the other.
    """

    keys: list[BlockHash] = field(default_factory=list)
    admitted: bool = False
    first: int = 0
    promoted: set[BlockHash] = field(default_factory=set)
    _index: dict[BlockHash, int] = field(default_factory=dict)
    _read: int = 0  # entries of the context's record already read

    def index(self, key: BlockHash) -> int:
        """Where ``key`` is in ``keys`` (it is there: ``RequestKeys.of`` adds it)."""
        return self._index[key]

    def _append(self, key: BlockHash) -> None:
        if key not in self._index:
            self._index[key] = len(self.keys)
            self.keys.append(key)


class RequestKeys:
    """The keys of the requests the scheduler is serving, by request id."""

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}
        self._warned = False

    def of(self, req_context: Any, key: BlockHash) -> Request:
        """The keys of ``req_context``'s request in ``key``'s group, ``key`` among them."""
        request = self._requests.get(req_context.req_id)
        if request is None:
            request = self._requests[req_context.req_id] = Request()
        record = getattr(req_context, "_offload_key_positions", None)
        if isinstance(record, Mapping):
            if len(record) > request._read:
                group = bytes(key)[-GROUP_SUFFIX:]
                for recorded in itertools.islice(record, request._read, None):
                    if bytes(recorded)[-GROUP_SUFFIX:] == group:
                        request._append(BlockHash(bytes(recorded)))
                request._read = len(record)
        elif not self._warned:
            self._warned = True
            logger.warning(
                "kvtier: this vLLM's request context records no offload keys; the "
                "policies see each request as the keys vLLM looks up"
            )
        request._append(key)
        return request

    def forget(self, req_context: Any) -> None:
        """The request finished: its keys are no longer needed."""
        self._requests.pop(req_context.req_id, None)

    def __len__(self) -> int:
        return len(self._requests)
