"""Node-pressure eviction, as the kubelet's eviction manager: signals, pressure conditions, admission, evictions."""

from edgelet.eviction.manager import EvictionManager
from edgelet.eviction.policy import HARD_EVICTION_GRACE_SECONDS, REASON, evicted_status
from edgelet.eviction.signals import NodeSignals, Observation, image_fs_mountpoint
from edgelet.eviction.usage import PodUsage, PodUsageReader

__all__ = ["EvictionManager", "HARD_EVICTION_GRACE_SECONDS", "NodeSignals", "Observation", "PodUsage",
           "PodUsageReader", "REASON", "evicted_status", "image_fs_mountpoint"]
