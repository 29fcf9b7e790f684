"""The CPU manager: exclusive CPUs for Guaranteed pods with whole-CPU requests (static policy), or none."""

from edgelet.cm.cpumanager.manager import CPUManager
from edgelet.cm.cpumanager.policy import POLICIES, CPUAllocationError, CPUStateError
from edgelet.cm.cpumanager.state import CPUStateStore

__all__ = ["CPUManager", "CPUStateStore", "CPUAllocationError", "CPUStateError", "POLICIES"]
