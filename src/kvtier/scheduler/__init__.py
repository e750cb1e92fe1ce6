"""Scheduler side: block keys in, decisions out. Pure Python; never imports torch.

Public entry points::

    from kvtier.scheduler import CPUOffloadingManager
    m = CPUOffloadingManager(num_blocks=1024, block_size=16, eviction_policy="lru")
"""

from kvtier.scheduler.manager import CPUOffloadingManager, TierManager
from kvtier.scheduler.policies import POLICIES, EvictionPolicy, make_policy
from kvtier.scheduler.protocol import (
    ManagerStats,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
)
from kvtier.scheduler.serve import serve_request

__all__ = [
    "POLICIES",
    "CPUOffloadingManager",
    "EvictionPolicy",
    "ManagerStats",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "TierManager",
    "make_policy",
    "serve_request",
]
