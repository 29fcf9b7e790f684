"""API-server defaulting for pods read from manifests, and the kubelet's static-pod identity rules."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from edgelet.api import podutil
from edgelet.api.kubetime import format_micro_time

DEFAULT_SCHEDULER = "default-scheduler"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_VOLUME_MODE = 0o644
_PROBE_DEFAULTS = {"periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
# Static pods tolerate every NoExecute taint so node problems never evict them (kubelet does the same).
_STATIC_TOLERATION = {"operator": "Exists", "effect": "NoExecute"}
# Bumping this changes every static pod's uid, which restarts all of them on upgrade: do it never.
_UID_ALGORITHM_VERSION = "v1"


def apply_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """Fill in what the API server would default on create; mutates and returns `pod`.

    Tolerates any shape: parts of the wrong type are left for validation to report.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", DEFAULT_SCHEDULER)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    host_network = spec.get("hostNetwork") is True
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in _dicts(spec.get(field)):
            _default_container(container, host_network=host_network)
    for volume in _dicts(spec.get("volumes")):
        _default_volume(volume)
    return pod


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def default_pull_policy(image: Any) -> str:
    """Always for `:latest` or an untagged image, IfNotPresent for any other tag or a digest."""
    if not isinstance(image, str):
        return "IfNotPresent"
    if "@" in image:
        return "IfNotPresent"
    last_component = image.rsplit("/", 1)[-1]
    _, colon, tag = last_component.partition(":")
    return "Always" if not colon or tag == "latest" else "IfNotPresent"


def _default_container(container: dict[str, Any], *, host_network: bool) -> None:
    container.setdefault("imagePullPolicy", default_pull_policy(container.get("image")))
    container.setdefault("terminationMessagePath", DEFAULT_TERMINATION_MESSAGE_PATH)
    container.setdefault("terminationMessagePolicy", "File")
    for port in _dicts(container.get("ports")):
        port.setdefault("protocol", "TCP")
        if host_network and port.get("containerPort") is not None:
            port.setdefault("hostPort", port["containerPort"])
    resources = container.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        # A limit without a request means "request what you limit" (API-server defaulting).
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, amount in resources["limits"].items():
                requests.setdefault(name, amount)
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if isinstance(probe, dict):
            _default_probe(probe)
    lifecycle = container.get("lifecycle")
    if isinstance(lifecycle, dict):
        for hook in ("postStart", "preStop"):
            handler = lifecycle.get(hook)
            if isinstance(handler, dict):
                _default_http_get(handler)
    for env in _dicts(container.get("env")):
        value_from = env.get("valueFrom")
        if isinstance(value_from, dict) and isinstance(value_from.get("fieldRef"), dict):
            value_from["fieldRef"].setdefault("apiVersion", "v1")


def _default_probe(probe: dict[str, Any]) -> None:
    for field, value in _PROBE_DEFAULTS.items():
        probe.setdefault(field, value)
    _default_http_get(probe)


def _default_http_get(handler: dict[str, Any]) -> None:
    http_get = handler.get("httpGet")
    if isinstance(http_get, dict):
        http_get.setdefault("path", "/")
        http_get.setdefault("scheme", "HTTP")


def _default_volume(volume: dict[str, Any]) -> None:
    if not any(key != "name" for key in volume):
        volume["emptyDir"] = {}  # a volume with no source is an emptyDir
    for kind in ("secret", "configMap", "downwardAPI", "projected"):
        source = volume.get(kind)
        if isinstance(source, dict):
            source.setdefault("defaultMode", DEFAULT_VOLUME_MODE)


def static_pod_uid(pod: dict[str, Any], node_name: str, source_location: str, source: str) -> str:
    """The deterministic uid of a static pod: md5 of its content as written, the node and where it came from.

    Like the kubelet, file pods hash the node and the file path, http pods the URL, so the same manifest on
    two nodes (or in two files) gets two uids, and any edit yields a new uid (the pod is replaced). The
    content is hashed as canonical JSON; the algorithm is pinned by a golden test.
    """
    hasher = hashlib.md5(usedforsecurity=False)
    hasher.update(_UID_ALGORITHM_VERSION.encode())
    hasher.update(json.dumps(pod, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    if source == podutil.SOURCE_FILE:
        hasher.update(f"host:{node_name}".encode())
        hasher.update(f"file:{source_location}".encode())
    else:
        hasher.update(f"url:{source_location}".encode())
    return hasher.hexdigest()


def now_rfc3339nano() -> str:
    """The kubelet's config.seen stamp (microseconds; the kubelet writes nanoseconds)."""
    return format_micro_time(time.time())


def make_static(pod: dict[str, Any], node_name: str, source_location: str, *, source: str = podutil.SOURCE_FILE,
                seen: str | None = None) -> dict[str, Any]:
    """Give a manifest pod its static identity on this node; mutates and returns `pod`.

    Call before `apply_defaults`: the uid hashes the pod as written, so changes to defaulting never change
    the uid of an unchanged manifest (which would restart every static pod on upgrade).
    """
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        metadata = pod["metadata"] = {}
    if not metadata.get("uid"):
        metadata["uid"] = static_pod_uid(pod, node_name, source_location, source)
    if isinstance(metadata.get("name"), str):
        metadata["name"] = f"{metadata['name']}-{node_name.lower()}"
    if not metadata.get("namespace"):
        metadata["namespace"] = "default"
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    annotations[podutil.CONFIG_HASH_ANNOTATION] = metadata["uid"]
    annotations[podutil.CONFIG_SOURCE_ANNOTATION] = source
    annotations[podutil.CONFIG_SEEN_ANNOTATION] = seen or now_rfc3339nano()
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec["nodeName"] = node_name
        if source == podutil.SOURCE_FILE:
            tolerations = spec.get("tolerations")
            if tolerations is None:
                tolerations = spec["tolerations"] = []
            if isinstance(tolerations, list) and not any(_covers(t) for t in tolerations):
                tolerations.append(dict(_STATIC_TOLERATION))
    status = pod.get("status")
    if not isinstance(status, dict):
        status = pod["status"] = {}
    status.setdefault("phase", "Pending")
    return pod


def _covers(toleration: Any) -> bool:
    return (isinstance(toleration, dict) and toleration.get("operator") == "Exists" and not toleration.get("key")
            and toleration.get("effect") in (None, "", "NoExecute"))
