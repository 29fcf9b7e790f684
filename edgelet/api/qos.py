"""A pod's QoS class (Guaranteed, Burstable, BestEffort) from its cpu and memory requests and limits.

The rules are the kubelet's: init containers count, requests left out default to the limits (the
API server's defaulting, which static pods never went through), and pod-level resources, when set,
decide alone.
"""

from __future__ import annotations

from typing import Any

from edgelet.api import podutil
from edgelet.api.quantity import parse_quantity

GUARANTEED = "Guaranteed"
BURSTABLE = "Burstable"
BEST_EFFORT = "BestEffort"

_QOS_RESOURCES = ("cpu", "memory")


def _quantity(value: Any, where: str) -> int:
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _positive(resources: dict[str, Any], where: str) -> dict[str, int]:
    """The cpu and memory entries above zero; zero means "not set" for QoS."""
    found = {}
    for name in _QOS_RESOURCES:
        if name in resources:
            amount = _quantity(resources[name], f"{where}.{name}")
            if amount > 0:
                found[name] = amount
    return found


def _requests_and_limits(resources: dict[str, Any] | None, where: str) -> tuple[dict, dict]:
    resources = resources or {}
    limits = _positive(resources.get("limits") or {}, f"{where}.limits")
    requests = _positive(resources.get("requests") or {}, f"{where}.requests")
    # Defaulting copies a limit into a missing request, so check the raw key, not the parsed value.
    raw_requests = resources.get("requests") or {}
    for name, amount in limits.items():
        if name not in raw_requests:
            requests[name] = amount
    return requests, limits


def qos_class(pod: podutil.Pod) -> str:
    """The pod's QoS class; raises ValueError naming the field when a quantity cannot be parsed."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True

    pod_resources = podutil.spec(pod).get("resources")
    pod_requests, pod_limits = _requests_and_limits(pod_resources, "spec.resources")
    if pod_requests or pod_limits:
        requests, limits = pod_requests, pod_limits
        guaranteed = set(pod_limits) == set(_QOS_RESOURCES)
    else:
        for field, specs in (("spec.containers", podutil.containers(pod)),
                             ("spec.initContainers", podutil.init_containers(pod))):
            for index, container in enumerate(specs):
                container_requests, container_limits = _requests_and_limits(
                    container.get("resources"), f"{field}[{index}].resources")
                for name, amount in container_requests.items():
                    requests[name] = requests.get(name, 0) + amount
                for name, amount in container_limits.items():
                    limits[name] = limits.get(name, 0) + amount
                if set(container_limits) != set(_QOS_RESOURCES):
                    guaranteed = False

    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and requests.keys() == limits.keys() and all(limits[n] == requests[n] for n in requests):
        return GUARANTEED
    return BURSTABLE
