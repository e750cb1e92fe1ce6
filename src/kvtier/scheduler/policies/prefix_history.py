"""``PrefixHistory``: what the recent traffic says about each key's place in its prefix tree.

Runs in the scheduler; pure Python. The ``density`` policy (``policies/density.py``)
sorts a request's blocks into classes by two facts a hash key does not carry but the
requests that looked it up do:

* **generation**: how many requests this prefix chain has been extended by. A request
  whose deepest known key has generation ``g`` is generation ``g + 1``; a request with
  no known key is generation 0. A chat's turn ``k`` is generation ``k`` (or ``k + 1``
  on a system prompt some earlier chat stored); a document asked about again is one
  more than the document. How long chains live is what the policy then learns.
* **shared prefix**: a key that has been followed by two different next keys is a
  *branching point* (a system or tool prompt several conversations continue); it and
  every key before it in the request are shared.

Known keys keep the generation of the request that first saw them. The history is
bounded: two generations of tables, the current one replaced when it holds more than
``limit`` keys, so it remembers between ``limit`` and ``2 * limit`` keys, resident or
not (a key seen again moves to the current table)::

    classify(keys) ─► (generation, index of the last shared key or -1)
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.blocks import BlockHash

BRANCHED = object()
"""The ``next`` of a key seen followed by two different keys."""


class PrefixHistory:
    """Generation and branching of recently looked-up keys.

    Args:
        limit: keys the current table holds before it becomes the old one (> 0).
    """

    __slots__ = ("_current", "_limit", "_old")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        # key -> [generation, next key: None (none yet), a key, or BRANCHED]
        self._current: dict[BlockHash, list[object]] = {}
        self._old: dict[BlockHash, list[object]] = {}

    def __len__(self) -> int:
        return len(self._current) + len(self._old)

    def __contains__(self, key: object) -> bool:
        return key in self._current or key in self._old

    def generation(self, key: BlockHash) -> int | None:
        """The key's generation, or ``None`` if it is not remembered (for tests and
        diagnostics; ``classify`` gives the policy what it uses)."""
        entry = self._current.get(key) or self._old.get(key)
        return None if entry is None else entry[0]  # type: ignore[return-value]

    def classify(self, keys: Sequence[BlockHash]) -> tuple[int, int]:
        """Learn one request's keys (its whole prefix, in order) and return its
        generation and the index of its last shared key (``-1``: none shared)."""
        current, old = self._current, self._old
        generation = 0
        for key in reversed(keys):
            entry = current.get(key) or old.get(key)
            if entry is not None:
                generation = entry[0] + 1  # type: ignore[operator]
                break
        last_shared = -1
        n = len(keys)
        for i, key in enumerate(keys):
            following = keys[i + 1] if i + 1 < n else None
            entry = current.get(key)
            if entry is None:
                entry = old.pop(key, None)
                if entry is None:
                    current[key] = [generation, following]
                    continue
                current[key] = entry
            seen = entry[1]
            if seen is None:
                entry[1] = following
            elif seen is BRANCHED or (following is not None and seen != following):
                entry[1] = BRANCHED
                last_shared = i
        if len(current) > self._limit:
            self._old = current
            self._current = {}
        return generation, last_shared
