"""Container probes (startup, liveness, readiness) and lifecycle hooks (postStart, preStop).

`ProbeManager` runs one worker per probe and hands the sync and the status their results;
`HookRunner` runs the hooks for the runtime manager. The checks themselves live in `probes`.
"""

from .hooks import HookError, HookRunner
from .manager import ProbeManager
from .results import Outcome, ProbeError, ProbeType, Result

__all__ = ["HookError", "HookRunner", "Outcome", "ProbeError", "ProbeManager", "ProbeType", "Result"]
