"""Pod status fields kubelets added from 1.31 on, laid over what `generate_pod_status` made (pure): each
container's process identity (`user`), its allocated and applied resources with the resize conditions, and
`observedGeneration` on the status and the kubelet's conditions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from edgelet.api import podutil
from edgelet.container.runtime import ContainerStatus, PodRuntimeStatus

from ..kuberuntime.resize import RESIZE_IN_PROGRESS, RESIZE_PENDING
from ..kuberuntime.resizer import ResizeView, reported_applied
from .generate import KUBELET_CONDITIONS, POD_SCHEDULED

# The conditions whose observedGeneration the kubelet sets (PodScheduled is the scheduler's).
_GENERATION_CONDITIONS = (KUBELET_CONDITIONS - {POD_SCHEDULED}) | {RESIZE_PENDING, RESIZE_IN_PROGRESS}
_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


def generation(pod: podutil.Pod) -> int | None:
    """metadata.generation, which API servers set on pods since 1.33 (None before, and for static pods)."""
    value = (pod.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def add_observed_generation(status: dict[str, Any], pod: podutil.Pod) -> None:
    """status.observedGeneration and each kubelet condition's, as kubelets do since 1.34."""
    observed = generation(pod)
    if observed is None:
        return
    status["observedGeneration"] = observed
    for condition in status.get("conditions") or []:
        if condition.get("type") in _GENERATION_CONDITIONS:
            condition["observedGeneration"] = observed


def container_user(container: ContainerStatus) -> dict[str, Any] | None:
    """containerStatuses[].user from the runtime's ContainerStatus.user (kubelet 1.31+, SupplementalGroupsPolicy)."""
    if container.user is None:
        return None
    uid, gid, groups = container.user
    linux: dict[str, Any] = {"uid": uid, "gid": gid}
    if groups:
        linux["supplementalGroups"] = list(groups)
    return {"linux": linux}


def runtime_container(status: dict[str, Any], runtime: PodRuntimeStatus) -> ContainerStatus | None:
    """The runtime's container a container status names by containerID."""
    container_id = status.get("containerID") or ""
    bare = container_id.split("://", 1)[-1]
    if not bare:
        return None
    return next((c for c in runtime.containers if c.id == bare), None)


def container_statuses(status: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for key in _STATUS_LISTS:
        yield from status.get(key) or []


def add_resources(status: dict[str, Any], runtime: PodRuntimeStatus, resize: ResizeView) -> None:
    """allocatedResources on each regular container, resources (what its cgroup holds, over the allocation) on
    each running one, and the open resize conditions: what the API server reads to let a pod be resized."""
    for item in status.get("containerStatuses") or []:
        allocated = resize.allocated.get(item.get("name", ""))
        if allocated is None:
            continue
        if allocated.get("requests"):
            item["allocatedResources"] = dict(allocated["requests"])
        container = runtime_container(item, runtime)
        if container is not None and "running" in (item.get("state") or {}):
            applied = resize.applied.get(container.id) or reported_applied(container)
            item["resources"] = ResizeView(resize.allocated, {container.id: applied} if applied else {}).resources(
                item["name"], container.id)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in (RESIZE_PENDING,
                                                                                     RESIZE_IN_PROGRESS)]
    status["conditions"] = conditions + [dict(c) for c in resize.conditions]


def add_newer_fields(status: dict[str, Any], pod: podutil.Pod, runtime: PodRuntimeStatus,
                     resize: ResizeView | None = None) -> dict[str, Any]:
    """`status` with the fields of this module's text (in place; returned for chaining)."""
    for item in container_statuses(status):
        container = runtime_container(item, runtime)
        user = container_user(container) if container is not None else None
        if user is not None:
            item["user"] = user
    if resize is not None:
        add_resources(status, runtime, resize)
    add_observed_generation(status, pod)
    return status
