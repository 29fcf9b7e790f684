"""Probe results per container instance: the kubelet's prober results managers, one cache per probe type.

Results are keyed by container id, so a restarted container never inherits the verdict of the
instance before it. Setting a result reports whether it changed; the manager turns changes into
re-syncs of the pod.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Callable
from dataclasses import dataclass


class ProbeType(enum.Enum):
    """The three probes a container may have; the value is the kubelet's `probe_type` metric label."""

    LIVENESS = "Liveness"
    READINESS = "Readiness"
    STARTUP = "Startup"

    @property
    def field(self) -> str:
        """The container spec field holding this probe."""
        return self.name.lower() + "Probe"


class Result(enum.Enum):
    """A probe's verdict; the value is the kubelet's `result` metric label."""

    UNKNOWN = "unknown"
    SUCCESS = "successful"
    FAILURE = "failed"


# What a worker reports for a container it has not probed yet (the kubelet's initialValue): a
# container is not ready until proven so, alive until proven dead, and not started until it is.
INITIAL_RESULT = {
    ProbeType.READINESS: Result.FAILURE,
    ProbeType.LIVENESS: Result.SUCCESS,
    ProbeType.STARTUP: Result.UNKNOWN,
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one check found: the verdict and the text that explains it (command output, HTTP status)."""

    result: Result
    output: str = ""
    warning: bool = False  # passed, but with something to tell (an unfollowed redirect): a ProbeWarning event


class ProbeError(Exception):
    """The probe could not run at all (unresolvable port, no pod IP, runtime unreachable).

    Unlike a failure, an error says nothing about the container, so its result is thrown away.
    """


@dataclass(slots=True)
class _Entry:
    pod_uid: str
    container_name: str
    result: Result


class ResultsCache:
    """The results of one probe type, by container id.

    `on_change(pod_uid, container_id, result)` is called whenever a stored result changes, including
    the first result stored for a container id (as the kubelet's results manager sends an update).
    """

    def __init__(self, probe_type: ProbeType, on_change: Callable[[str, str, Result], None] | None = None):
        self.probe_type = probe_type
        self._entries: dict[str, _Entry] = {}
        self._on_change = on_change

    def set(self, container_id: str, pod_uid: str, container_name: str, result: Result) -> bool:
        """Stores `result`; returns whether it differs from what was stored before."""
        entry = self._entries.get(container_id)
        if entry is not None and entry.result is result:
            return False
        self._entries[container_id] = _Entry(pod_uid, container_name, result)
        if self._on_change is not None:
            self._on_change(pod_uid, container_id, result)
        return True

    def get(self, container_id: str) -> Result | None:
        entry = self._entries.get(container_id)
        return entry.result if entry is not None else None

    def remove(self, container_id: str) -> None:
        self._entries.pop(container_id, None)

    def remove_pod(self, pod_uid: str) -> None:
        for container_id in [cid for cid, entry in self._entries.items() if entry.pod_uid == pod_uid]:
            del self._entries[container_id]

    def container_ids(self, pod_uid: str, result: Result) -> builtins.set[str]:
        """The ids of the pod's containers whose stored result is `result`."""
        return {cid for cid, entry in self._entries.items() if entry.pod_uid == pod_uid and entry.result is result}

    def __len__(self) -> int:
        return len(self._entries)
