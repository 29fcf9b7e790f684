"""Typed runtime state of pods as CRI reports it: what the PLEG caches and the sync decisions read."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ContainerState(enum.IntEnum):
    """CRI `runtime.v1.ContainerState` values."""

    CREATED = 0
    RUNNING = 1
    EXITED = 2
    UNKNOWN = 3


class SandboxState(enum.IntEnum):
    """CRI `runtime.v1.PodSandboxState` values."""

    READY = 0
    NOTREADY = 1


@dataclass(slots=True)
class SandboxStatus:
    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at: int  # nanoseconds since the epoch, as CRI reports it
    ip: str = ""
    host_network: bool = False
    source: str = ""  # the pod source (file, http, api) its config.source annotation names; "" when unknown


@dataclass(slots=True)
class ContainerStatus:
    id: str
    name: str
    sandbox_id: str
    state: ContainerState
    created_at: int  # nanoseconds since the epoch
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    image: str = ""
    image_ref: str = ""
    image_id: str = ""
    hash: str = ""  # io.kubernetes.container.hash
    restart_count: int = 0  # io.kubernetes.container.restartCount
    attempt: int = 0
    log_path: str = ""
    grace_period: int = -1  # io.kubernetes.pod.terminationGracePeriod; -1 when absent
    user: tuple[int, int, tuple[int, ...]] | None = None  # (uid, gid, supplemental groups) of its first process
    resources: tuple[int, int, int, int] | None = None  # cgroup (cpu shares, quota, period, memory limit) reported


@dataclass(frozen=True, slots=True)
class RuntimeHandlerInfo:
    """One runtime handler (RuntimeClass) and what pods can use of it through this node."""

    name: str  # "" for the default handler
    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False


@dataclass(frozen=True, slots=True)
class RuntimeFeatures:
    """What the runtime's CRI Status says it can do, as far as edgelet passes it on to pods."""

    handlers: tuple[RuntimeHandlerInfo, ...] = ()
    supplemental_groups_policy: bool = False


@dataclass(slots=True)
class PodRuntimeStatus:
    """Everything the runtime knows of one pod; sandboxes and containers newest first."""

    uid: str
    name: str = ""
    namespace: str = ""
    sandboxes: list[SandboxStatus] = field(default_factory=list)
    containers: list[ContainerStatus] = field(default_factory=list)
    timestamp: float = 0.0  # when this was inspected (time.monotonic(): it orders observations, wall time may jump)

    @property
    def ip(self) -> str:
        return self.sandboxes[0].ip if self.sandboxes else ""

    def latest_container(self, name: str) -> ContainerStatus | None:
        """The newest container with this name (list is newest first)."""
        for status in self.containers:
            if status.name == name:
                return status
        return None

    def running_containers(self) -> list[ContainerStatus]:
        return [c for c in self.containers if c.state == ContainerState.RUNNING]
