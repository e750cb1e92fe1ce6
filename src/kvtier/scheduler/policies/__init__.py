"""Eviction policies as strategies, registered by name.

``make_policy("lru", capacity)`` builds one; ``POLICIES`` lists them. Adding a policy
is one module plus one line here.
"""

from __future__ import annotations

from kvtier.errors import ConfigError
from kvtier.scheduler.policies.adaptive import AdaptivePolicy
from kvtier.scheduler.policies.arc import ARCPolicy
from kvtier.scheduler.policies.base import EvictionPolicy
from kvtier.scheduler.policies.density import DensityPolicy
from kvtier.scheduler.policies.leader import LeaderPolicy
from kvtier.scheduler.policies.lru import LRUPolicy
from kvtier.scheduler.policies.slru import SegmentedLRUPolicy

POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRUPolicy,
    "arc": ARCPolicy,
    "slru": SegmentedLRUPolicy,
    "adaptive": AdaptivePolicy,
    "leader": LeaderPolicy,
    "density": DensityPolicy,
}


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """Build the policy registered as ``name`` for a tier of ``capacity`` blocks.

    Raises:
        ConfigError: ``name`` is not a registered policy (key ``eviction_policy``).
    """
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(
            "eviction_policy",
            f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}",
        ) from None
    return cls(capacity)


__all__ = [
    "POLICIES",
    "ARCPolicy",
    "AdaptivePolicy",
    "DensityPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "LeaderPolicy",
    "make_policy",
]
