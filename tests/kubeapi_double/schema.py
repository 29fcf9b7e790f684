"""How the real API server stores a pod status: the fields its PodStatus knows (others are dropped without an
error), empty strings and lists left out, and `null` for unset condition times. v1.36 (the e2e control plane,
which test_api_double compares against) by default, with what current nodes report (hostIPs, resize,
observedGeneration, containers' resources and user); asked for an older release (below 1.35) it keeps 1.20's fields."""

from __future__ import annotations

from typing import Any

CURRENT_MINOR = 36  # the release the double answers as unless told otherwise


def server_version(minor: int) -> dict[str, str]:
    """What /version answers for release 1.`minor`."""
    return {"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0-double"}


# core/v1 PodStatus as of 1.20: hostIPs (1.28), resize (1.27) and later fields are unknown.
POD_STATUS_FIELDS = frozenset({
    "phase", "conditions", "message", "reason", "nominatedNodeName", "hostIP", "podIP", "podIPs", "startTime",
    "initContainerStatuses", "containerStatuses", "qosClass", "ephemeralContainerStatuses",
})
# core/v1 ContainerStatus as of 1.20 (no resources, allocatedResources, user, volumeMounts...).
CONTAINER_STATUS_FIELDS = frozenset({
    "name", "state", "lastState", "ready", "restartCount", "image", "imageID", "containerID", "started",
})
CONTAINER_STATUS_LISTS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
# core/v1 PodCondition as of 1.20.
CONDITION_FIELDS = frozenset({"type", "status", "lastProbeTime", "lastTransitionTime", "reason", "message"})
# What current releases (1.35, 1.36) add to each.
POD_STATUS_FIELDS_CURRENT = POD_STATUS_FIELDS | {"hostIPs", "resize", "observedGeneration", "resourceClaimStatuses"}
CONTAINER_STATUS_FIELDS_CURRENT = CONTAINER_STATUS_FIELDS | {
    "allocatedResources", "allocatedResourcesStatus", "resources", "user", "volumeMounts", "stopSignal"}
CONDITION_FIELDS_CURRENT = CONDITION_FIELDS | {"observedGeneration"}
# Go's metav1.Time without omitempty: an unset time is written as null.
CONDITION_TIMES = ("lastProbeTime", "lastTransitionTime")


def stored_pod_status(status: Any, minor: int = CURRENT_MINOR) -> dict[str, Any]:
    """`status` as a round trip through the server's Go types (of 1.`minor`) leaves it."""
    if not isinstance(status, dict):
        return {}
    pod_fields, container_fields, condition_fields = (
        (POD_STATUS_FIELDS_CURRENT, CONTAINER_STATUS_FIELDS_CURRENT, CONDITION_FIELDS_CURRENT) if minor >= 35
        else (POD_STATUS_FIELDS, CONTAINER_STATUS_FIELDS, CONDITION_FIELDS))
    result = {key: value for key, value in status.items() if key in pod_fields}
    for key in CONTAINER_STATUS_LISTS:
        if isinstance(result.get(key), list):
            result[key] = [_known(item, container_fields) for item in result[key]]
    if isinstance(result.get("conditions"), list):
        result["conditions"] = [_condition(_known(item, condition_fields)) for item in result["conditions"]]
    return _omit_empty(result)


def _known(item: Any, fields: frozenset[str]) -> Any:
    return {key: value for key, value in item.items() if key in fields} if isinstance(item, dict) else item


def _condition(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    condition = dict(item)
    for key in CONDITION_TIMES:
        condition.setdefault(key, None)
    return condition


def _omit_empty(value: Any) -> Any:
    """omitempty on strings and slices (nested too); nulls stay as Go writes them."""
    if isinstance(value, dict):
        return {key: _omit_empty(item) for key, item in value.items() if item != "" and item != []}
    if isinstance(value, list):
        return [_omit_empty(item) for item in value]
    return value
