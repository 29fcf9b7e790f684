"""Carries out in-place resizes over CRI (UpdateContainerResources, or a restart where the resizePolicy asks for
one) and keeps what the status reports of them: each container's allocated resources, what its cgroup holds,
and the PodResizePending / PodResizeInProgress conditions.

The decisions are `edgelet.kuberuntime.resize` (pure); this module asks the runtime and remembers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.api.kubetime import format_time
from edgelet.api.podutil import Pod
from edgelet.api.quantity import parse_quantity, to_int_ceil, to_millis_ceil
from edgelet.api.resources import QUOTA_PERIOD, linux_resources
from edgelet.container.runtime import ContainerStatus, PodRuntimeStatus
from edgelet.util.errors import EdgeletError

from ..cm.cgroups import CgroupResources, pod_resources, widest
from ..cri import runtime_v1_pb2 as pb
from ..events import NO_EVENTS, WARNING, Recorder, pod_ref
from .resize import (
    DEFERRED,
    RESIZE_IN_PROGRESS,
    RESIZE_PENDING,
    Applied,
    ContainerChange,
    ResizePlan,
    applied_resources,
    plan_resize,
    pod_requests,
)

log = logging.getLogger(__name__)

Restart = Callable[[dict, ContainerChange], Awaitable[None]]
PodCgroupLimits = Callable[[Pod, CgroupResources], Awaitable[None]]


@dataclass(slots=True)
class _PodResize:
    """One pod's resize bookkeeping: what was allocated to each container and the open conditions."""

    allocated: dict[str, dict[str, Any]]
    pending: tuple[str, str, float] | None = None  # reason, message, since
    error: tuple[str, float] | None = None  # the last failed update's message, since


@dataclass(frozen=True, slots=True)
class ResizeView:
    """What the status shows of a pod's resources (read by edgelet.status.extras)."""

    allocated: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # container name -> resources
    applied: Mapping[str, Applied] = field(default_factory=dict)  # container id -> cgroup settings
    conditions: tuple[dict[str, Any], ...] = ()

    def resources(self, name: str, container_id: str) -> dict[str, Any]:
        return applied_resources(self.allocated.get(name) or {}, self.applied.get(container_id))


def _allocation(pod: Pod) -> dict[str, dict[str, Any]]:
    return {c["name"]: dict(c.get("resources") or {}) for c in podutil.containers(pod)}


def _with_allocation(pod: Pod, allocated: Mapping[str, Mapping[str, Any]]) -> Pod:
    """The pod as it was allocated: its containers with the resources `allocated` names."""
    containers = [{**c, "resources": dict(allocated.get(c["name"], c.get("resources") or {}))}
                  for c in podutil.containers(pod)]
    return {**pod, "spec": {**podutil.spec(pod), "containers": containers}}


def _allocatable(node_allocatable: Mapping[str, Any]) -> tuple[int, int]:
    return _parse_allocatable(node_allocatable.get("cpu", 0), node_allocatable.get("memory", 0))


@functools.lru_cache(maxsize=4)  # the node's allocatable rarely changes, and every sync of every pod asks
def _parse_allocatable(cpu: Any, memory: Any) -> tuple[int, int]:
    try:
        return to_millis_ceil(parse_quantity(cpu)), to_int_ceil(parse_quantity(memory))
    except ValueError:
        return 0, 0


def reported_applied(container: ContainerStatus) -> Applied | None:
    """The cgroup settings the runtime reports for a container (ContainerStatus.resources), if any, with the
    quota counted per the kubelet's period."""
    if container.resources is None:
        return None
    shares, quota, period, memory = container.resources
    if quota > 0 and period > 0 and period != QUOTA_PERIOD:
        quota = quota * QUOTA_PERIOD // period
    return Applied(shares, max(quota, 0), memory)


class Resizer:
    def __init__(self, runtime, *, node_allocatable: Mapping[str, Any] | None = None,
                 active_pods: Callable[[], list[Pod]] = lambda: [], recorder: Recorder = NO_EVENTS,
                 pod_cgroup_limits: PodCgroupLimits | None = None, static_cpu_policy: bool = False,
                 clock: Callable[[], float] = time.time):
        self._runtime = runtime
        self._node_allocatable = node_allocatable or {}
        self._active_pods = active_pods
        self._recorder = recorder
        self._clock = clock
        self._pod_cgroup_limits = pod_cgroup_limits
        self._static_cpu_policy = static_cpu_policy
        self._applied: dict[str, Applied] = {}  # container id -> what our last successful update set
        self._pods: dict[str, _PodResize] = {}

    def applied(self, container: ContainerStatus) -> Applied | None:
        return self._applied.get(container.id) or reported_applied(container)

    def _others(self, uid: str) -> tuple[int, int]:
        cpu = memory = 0
        for pod in self._active_pods():
            if podutil.uid(pod) == uid:
                continue
            state = self._pods.get(podutil.uid(pod))
            allocated = ({"spec": {"containers": [{"name": n, "resources": r} for n, r in state.allocated.items()]}}
                         if state is not None else pod)
            pod_cpu, pod_memory = pod_requests(allocated)
            cpu, memory = cpu + pod_cpu, memory + pod_memory
        return cpu, memory

    def starting(self, pod: Pod) -> None:
        """The pod's containers start (again) from its spec: that is their allocation."""
        self._pods[podutil.uid(pod)] = _PodResize(_allocation(pod))

    async def sync(self, pod: Pod, status: PodRuntimeStatus, restart: Restart) -> float | None:
        """Applies a changed `resources` to the pod's running containers; returns when to look again (a
        resize left pending or failed is retried), or None."""
        uid = podutil.uid(pod)
        state = self._pods.get(uid)
        if state is None:
            state = self._pods[uid] = _PodResize(_allocation(pod))
        applied = {c.id: a for c in status.running_containers() if (a := self.applied(c)) is not None}
        # The other pods' allocations only matter to a change, and summing them is a pass over every pod:
        # a full resync of n unchanged pods must not cost n * n.
        plan_for = functools.partial(plan_resize, pod, status, applied, others=lambda: self._others(uid),
                                     allocatable=_allocatable(self._node_allocatable),
                                     static_cpu_policy=self._static_cpu_policy)
        plan = plan_for()
        if plan.pending is None and any(c.memory_decrease and not c.restart for c in plan.changes):
            plan = plan_for(memory_usage=await self._memory_usage(plan))
        if not plan.changes:
            state.allocated, state.pending, state.error = _allocation(pod), None, None
            return None
        if plan.pending is not None:
            reason, message = plan.pending
            if state.pending is None or state.pending[:2] != plan.pending:
                log.info("pod %s: resize %s: %s", podutil.full_name(pod), reason.lower(), message)
                state.pending = (reason, message, self._clock())
            return 10.0 if reason == DEFERRED else None
        state.pending = None
        before = _with_allocation(pod, state.allocated)
        state.allocated = _allocation(pod)
        return await self._actuate(pod, before, plan, state, restart)

    async def _actuate(self, pod: Pod, before: Pod, plan: ResizePlan, state: _PodResize,
                       restart: Restart) -> float | None:
        # Decreases first, so that the containers never hold more together than before and after (KEP 1287).
        ordered = sorted(plan.changes, key=lambda c: c.desired.memory_limit >= c.applied.memory_limit
                         and c.desired.cpu_shares >= c.applied.cpu_shares)
        specs = {c["name"]: c for c in podutil.containers(pod)}
        failures = []
        # The pod's cgroup holds the old and the new limits while the containers change, then the new ones.
        old_limits, new_limits = pod_resources(before), pod_resources(pod)
        try:
            if self._pod_cgroup_limits is not None:
                await self._pod_cgroup_limits(pod, widest(old_limits, new_limits))
            for change in ordered:
                try:
                    await self._apply(pod, specs[change.name], change, restart)
                except EdgeletError as exc:
                    failures.append(f"container {change.name}: {exc}")
            if self._pod_cgroup_limits is not None and not failures:
                await self._pod_cgroup_limits(pod, new_limits)
        except EdgeletError as exc:
            failures.append(f"pod cgroup: {exc}")
        if failures:
            message = "; ".join(failures)
            if state.error is None or state.error[0] != message:
                state.error = (message, self._clock())
                self._recorder.event(pod_ref(pod), WARNING, "ResizeError", message)
            return 10.0
        state.error = None
        return None

    async def _apply(self, pod: Pod, spec: dict, change: ContainerChange, restart: Restart) -> None:
        if change.restart:
            log.info("pod %s: container %s restarts for its resize (resizePolicy RestartContainer)",
                     podutil.full_name(pod), change.name)
            self._applied.pop(change.container_id, None)
            await restart(spec, change)
            return
        linux = linux_resources(pod, spec)
        linux.pop("oom_score_adj", None)  # not resized: the kubelet leaves it as the container started
        await self._runtime.update_container_resources(change.container_id, pb.LinuxContainerResources(**linux))
        self._applied[change.container_id] = change.desired

    async def _memory_usage(self, plan: ResizePlan) -> dict[str, int]:
        usage = {}
        for change in plan.changes:
            try:
                stats = await self._runtime.list_container_stats(pb.ContainerStatsFilter(id=change.container_id))
            except EdgeletError:
                continue
            for entry in stats:
                usage[change.container_id] = entry.memory.working_set_bytes.value
        return usage

    def view(self, pod: Pod) -> ResizeView:
        """The pod's resources as allocated (its spec until a resize was held back) and applied."""
        state = self._pods.get(podutil.uid(pod))
        if state is None:
            return ResizeView(_allocation(pod), self._applied)
        conditions = []
        if state.pending is not None:
            reason, message, since = state.pending
            conditions.append({"type": RESIZE_PENDING, "status": "True", "reason": reason, "message": message,
                               "lastProbeTime": None, "lastTransitionTime": format_time(since)})
        if state.error is not None:
            message, since = state.error
            conditions.append({"type": RESIZE_IN_PROGRESS, "status": "True", "reason": "Error", "message": message,
                               "lastProbeTime": None, "lastTransitionTime": format_time(since)})
        return ResizeView(state.allocated, self._applied, tuple(conditions))

    def forget(self, uid: str, container_ids: Iterable[str] = ()) -> None:
        self._pods.pop(uid, None)
        for container_id in container_ids:
            self._applied.pop(container_id, None)
