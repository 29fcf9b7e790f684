"""Accessors for pods kept as Kubernetes JSON dicts; the one place that knows their shape."""

from __future__ import annotations

from typing import Any, Iterator

Pod = dict[str, Any]

CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"
CONFIG_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONFIG_SEEN_ANNOTATION = "kubernetes.io/config.seen"

SOURCE_FILE = "file"
SOURCE_API = "api"
SOURCE_HTTP = "http"


def meta(pod: Pod) -> dict[str, Any]:
    return pod.get("metadata") or {}


def spec(pod: Pod) -> dict[str, Any]:
    return pod.get("spec") or {}


def uid(pod: Pod) -> str:
    return meta(pod).get("uid", "")


def name(pod: Pod) -> str:
    return meta(pod).get("name", "")


def namespace(pod: Pod) -> str:
    return meta(pod).get("namespace") or "default"


def full_name(pod: Pod) -> str:
    """The kubelet's `name_namespace` form used in logs and as a stable key for people."""
    return f"{name(pod)}_{namespace(pod)}"


def annotations(pod: Pod) -> dict[str, str]:
    return meta(pod).get("annotations") or {}


def source(pod: Pod) -> str:
    return annotations(pod).get(CONFIG_SOURCE_ANNOTATION, SOURCE_API)


def is_static(pod: Pod) -> bool:
    return source(pod) != SOURCE_API


def is_mirror(pod: Pod) -> bool:
    return CONFIG_MIRROR_ANNOTATION in annotations(pod)


def deletion_requested(pod: Pod) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def restart_policy(pod: Pod) -> str:
    return spec(pod).get("restartPolicy") or "Always"


def host_network(pod: Pod) -> bool:
    return bool(spec(pod).get("hostNetwork"))


HOSTNAME_MAX = 63


def hostname(pod: Pod) -> str:
    """The pod's hostname (the kubelet's GeneratePodHostNameAndDomain): spec.hostnameOverride when set (1.34+),
    else spec.hostname, else the pod's name; cut to 63 characters without a trailing '-' or '.'."""
    spec_ = spec(pod)
    value = spec_.get("hostnameOverride") or spec_.get("hostname") or name(pod)
    if len(value) > HOSTNAME_MAX:
        value = value[:HOSTNAME_MAX].rstrip("-.")
    return value


def grace_period_seconds(pod: Pod) -> int:
    """The pod's termination grace period; deletion may shorten it (deletionGracePeriodSeconds)."""
    override = meta(pod).get("deletionGracePeriodSeconds")
    if override is not None:
        return max(int(override), 0)
    value = spec(pod).get("terminationGracePeriodSeconds")
    return 30 if value is None else max(int(value), 0)


def containers(pod: Pod) -> list[dict[str, Any]]:
    return spec(pod).get("containers") or []


def init_containers(pod: Pod) -> list[dict[str, Any]]:
    return spec(pod).get("initContainers") or []


def ephemeral_containers(pod: Pod) -> list[dict[str, Any]]:
    """Debug containers added through the pods/ephemeralcontainers subresource (kubectl debug)."""
    return spec(pod).get("ephemeralContainers") or []


def is_sidecar(container: dict[str, Any]) -> bool:
    """A restartable init container (a native sidecar): it keeps running beside the app containers."""
    return container.get("restartPolicy") == "Always"


def all_containers(pod: Pod) -> Iterator[dict[str, Any]]:
    yield from init_containers(pod)
    yield from containers(pod)
