"""core/v1 Events as plain dicts, made the way client-go's recorder makes them: object references,
names, sources and the kubelet's event reasons.
"""

from __future__ import annotations

import sys
from typing import Any

from edgelet.api import podutil
from edgelet.api.kubetime import format_time

Event = dict[str, Any]
ObjectRef = dict[str, str]

NORMAL = "Normal"
WARNING = "Warning"

COMPONENT = "kubelet"  # kubectl users filter on it (source.component, reportingComponent)

# The API server's own event garbage collection (--event-ttl) defaults to one hour.
EVENT_TTL = 3600.0

# Long pull or mount errors would crowd the log and the describe table; kubectl shows one line anyway.
MAX_MESSAGE = 1024


def pod_ref(pod: podutil.PodView, container: str | None = None) -> ObjectRef:
    """The pod (or one of its containers: fieldPath `spec.containers{name}`) as involvedObject."""
    meta = pod.get("metadata") or {}
    ref = {"kind": "Pod", "namespace": meta.get("namespace") or "default", "name": meta.get("name", ""),
           "uid": meta.get("uid", ""), "apiVersion": "v1"}
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = meta["resourceVersion"]
    if container is not None:
        init = any(c.get("name") == container for c in podutil.init_containers(pod))
        # Interned: every event of every pod's container "main" (the correlator keeps thousands) shares one.
        ref["fieldPath"] = sys.intern(f"spec.{'initContainers' if init else 'containers'}{{{container}}}")
    return ref


def node_ref(node_name: str) -> ObjectRef:
    """The kubelet's node reference: no namespace, and the node's name as its uid."""
    return {"kind": "Node", "name": node_name, "uid": node_name}


def event_name(object_name: str, timestamp: float) -> str:
    """client-go's `<object name>.<unix nanoseconds in hex>`."""
    return f"{object_name}.{int(timestamp * 1e9):x}"


def make_event(ref: ObjectRef, event_type: str, reason: str, message: str, *, host: str, now: float) -> Event:
    """A new Event with count 1; namespace-less objects (the Node) get their events in "default"."""
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(ref.get("name", ""), now), "namespace": ref.get("namespace") or "default"},
        "involvedObject": dict(ref),
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT, "host": host},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "type": event_type,
        "eventTime": None,
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
    }
