"""Byte stores of the worker side: host memory (``pinned``); disk and remote to come.

Runs in the worker process; imports torch.
"""

from kvtier.media.pinned import HostSizing, HostSlab, host_sizing, pinning_available

__all__ = ["HostSizing", "HostSlab", "host_sizing", "pinning_available"]
