"""Objects that start afresh in a forked child (``os.fork``).

A thread of the parent that held a lock at the fork is not in the child, so the lock
would never be released there; sockets and probes in flight are the parent's. An
object registered with ``renew_after_fork`` has its ``_after_fork`` method called in
the child, right after the fork, to replace what it cannot share (its lock, its idle
connections, a probe no thread will finish). One hook serves every such object.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Protocol

logger = logging.getLogger(__name__)


class Renewable(Protocol):
    def _after_fork(self) -> None: ...


_LIVE: weakref.WeakSet[Renewable] = weakref.WeakSet()
"""Every registered object alive (held weakly: registering keeps nothing alive)."""


def renew_after_fork(obj: Renewable) -> None:
    """Call ``obj._after_fork()`` in every child forked while ``obj`` is alive."""
    _LIVE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_LIVE):
        try:
            obj._after_fork()
        except Exception:  # one object's failure must not leave the others unrenewed
            logger.exception("renewing %r after a fork failed", obj)


os.register_at_fork(after_in_child=_after_fork_in_child)
