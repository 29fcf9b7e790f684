"""Accessors for pods kept as Kubernetes JSON dicts; the one place that knows their shape."""

from collections.abc import Iterator, Mapping
from typing import Any

Pod = dict[str, Any]
PodView = Mapping[str, Any]  # what the accessors read: none of them changes a pod

CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"
CONFIG_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONFIG_SEEN_ANNOTATION = "kubernetes.io/config.seen"

SOURCE_FILE = "file"
SOURCE_API = "api"
SOURCE_HTTP = "http"


def meta(pod: PodView) -> dict[str, Any]:
    return pod.get("metadata") or {}


def spec(pod: PodView) -> dict[str, Any]:
    return pod.get("spec") or {}


def uid(pod: PodView) -> str:
    return meta(pod).get("uid", "")


def name(pod: PodView) -> str:
    return meta(pod).get("name", "")


def namespace(pod: PodView) -> str:
    return meta(pod).get("namespace") or "default"


def full_name(pod: PodView) -> str:
    """The kubelet's `name_namespace` form used in logs and as a stable key for people."""
    return f"{name(pod)}_{namespace(pod)}"


def annotations(pod: PodView) -> dict[str, str]:
    return meta(pod).get("annotations") or {}


def source(pod: PodView) -> str:
    return annotations(pod).get(CONFIG_SOURCE_ANNOTATION, SOURCE_API)


def is_static(pod: PodView) -> bool:
    return source(pod) != SOURCE_API


def is_mirror(pod: PodView) -> bool:
    return CONFIG_MIRROR_ANNOTATION in annotations(pod)


def deletion_requested(pod: PodView) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def restart_policy(pod: PodView) -> str:
    return spec(pod).get("restartPolicy") or "Always"


def host_network(pod: PodView) -> bool:
    return bool(spec(pod).get("hostNetwork"))


HOSTNAME_MAX = 63


def hostname(pod: PodView) -> str:
    """The pod's hostname (the kubelet's GeneratePodHostNameAndDomain): spec.hostnameOverride when set (1.34+),
    else spec.hostname, else the pod's name; cut to 63 characters without a trailing '-' or '.'."""
    spec_ = spec(pod)
    value = spec_.get("hostnameOverride") or spec_.get("hostname") or name(pod)
    if len(value) > HOSTNAME_MAX:
        value = value[:HOSTNAME_MAX].rstrip("-.")
    return value


def grace_period_seconds(pod: PodView) -> int:
    """The pod's termination grace period; deletion may shorten it (deletionGracePeriodSeconds)."""
    override = meta(pod).get("deletionGracePeriodSeconds")
    if override is not None:
        return max(int(override), 0)
    value = spec(pod).get("terminationGracePeriodSeconds")
    return 30 if value is None else max(int(value), 0)


def containers(pod: PodView) -> list[dict[str, Any]]:
    return spec(pod).get("containers") or []


def init_containers(pod: PodView) -> list[dict[str, Any]]:
    return spec(pod).get("initContainers") or []


def ephemeral_containers(pod: PodView) -> list[dict[str, Any]]:
    """Debug containers added through the pods/ephemeralcontainers subresource (kubectl debug)."""
    return spec(pod).get("ephemeralContainers") or []


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A restartable init container (a native sidecar): it keeps running beside the app containers."""
    return container.get("restartPolicy") == "Always"


def all_containers(pod: PodView) -> Iterator[dict[str, Any]]:
    yield from init_containers(pod)
    yield from containers(pod)
