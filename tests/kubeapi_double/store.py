"""The API server double's object store: objects by resource, resourceVersions, watch history,
selectors and the update rules (conflicts, preconditions, graceful pod deletion). No I/O here.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.kubeapi_double.patch import PatchError, StrategicMergePanic, json_merge, json_patch, strategic_merge
from tests.kubeapi_double.schema import CURRENT_MINOR, stored_pod_status


@dataclass(frozen=True, slots=True)
class Resource:
    plural: str
    api_version: str  # "v1" or "group/version"
    kind: str
    namespaced: bool
    has_status: bool
    stored: bool = True  # events.k8s.io/v1 events are accepted and discarded


RESOURCES = {
    r.plural: r
    for r in (
        Resource("pods", "v1", "Pod", True, True),
        Resource("nodes", "v1", "Node", False, True),
        Resource("configmaps", "v1", "ConfigMap", True, False),
        Resource("secrets", "v1", "Secret", True, False),
        Resource("persistentvolumeclaims", "v1", "PersistentVolumeClaim", True, True),
        Resource("persistentvolumes", "v1", "PersistentVolume", False, True),
        Resource("csinodes", "storage.k8s.io/v1", "CSINode", False, False),
        Resource("csidrivers", "storage.k8s.io/v1", "CSIDriver", False, False),
        Resource("volumeattachments", "storage.k8s.io/v1", "VolumeAttachment", False, True),
        Resource("services", "v1", "Service", True, True),
        Resource("events", "v1", "Event", True, False),
        Resource("leases", "coordination.k8s.io/v1", "Lease", True, False),
        Resource("certificatesigningrequests", "certificates.k8s.io/v1", "CertificateSigningRequest", False, True),
    )
}
# events.k8s.io/v1 events share the plural; they are discarded all the same.
EVENTS_V1 = Resource("events", "events.k8s.io/v1", "Event", True, False, stored=False)


class StatusError(Exception):
    """An API failure answered as a `Status` object with this HTTP code and reason."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the watch history."""

    rv: int
    type: str  # ADDED / MODIFIED / DELETED
    resource: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def timestamp(now: float) -> str:
    return datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resized_pod(old: dict[str, Any], new: dict[str, Any], minor: int) -> dict[str, Any]:
    """The pods/resize subresource (1.33+): only the containers' resources and resizePolicy change, and only
    on a node that reports running containers' resources (the 1.35 API server's checks and messages)."""
    name = old["metadata"]["name"]
    if minor < 33:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    running_without = any("running" in (s.get("state") or {}) and s.get("resources") is None
                          for s in (old.get("status") or {}).get("containerStatuses") or [])
    if running_without:
        raise StatusError(422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: Pod running on node without '
                                          "support for resize")
    result = copy.deepcopy(old)
    wanted = {c.get("name"): c for c in (new.get("spec") or {}).get("containers") or []}
    for container in result["spec"].get("containers") or []:
        changed = wanted.get(container["name"])
        if changed is None:
            continue
        for key in ("resources", "resizePolicy"):
            if key in changed:
                container[key] = copy.deepcopy(changed[key])
    if qos_of(result) != qos_of(old):
        raise StatusError(422, "Invalid", f'Pod "{name}" is invalid: spec: Invalid value: "{qos_of(result)}": '
                                          "Pod QOS Class may not change as a result of resizing")
    return result


def qos_of(pod: dict[str, Any]) -> str:
    """The pod's QoS class from its containers' requests and limits (the API's GetPodQOS, cpu and memory)."""
    requests = limits = 0
    guaranteed = True
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        request, limit = resources.get("requests") or {}, resources.get("limits") or {}
        requests += len(request)
        limits += len(limit)
        for resource in ("cpu", "memory"):
            if resource not in limit or request.get(resource, limit.get(resource)) != limit.get(resource):
                guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class Store:
    """Objects of every resource, one global resourceVersion counter, a bounded change history."""

    def __init__(self, *, history_size: int = 1000, clock: Callable[[], float] = time.time,
                 minor: int = CURRENT_MINOR):
        self.minor = minor  # the API server release it answers as (1.36 unless told otherwise)
        self.rv = 1
        self.compacted_rv = 0  # a watch must start at or after this resourceVersion
        self.history: deque[Change] = deque()
        self.history_size = history_size
        self.received_events: deque[dict[str, Any]] = deque(maxlen=1000)
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in RESOURCES}
        self._listeners: list[Callable[[Change], None]] = []
        self._clock = clock

    # -- watch plumbing -------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[Change], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def changes_since(self, rv: int) -> list[Change]:
        """History after `rv`; StatusError 410 when that part of the history is gone."""
        if rv < self.compacted_rv:
            raise StatusError(410, "Expired", f"too old resource version: {rv} ({self.compacted_rv})")
        return [c for c in self.history if c.rv > rv]

    def compact(self) -> None:
        """Forget the history: any watch from an older resourceVersion now gets 410 Gone."""
        self.history.clear()
        self.compacted_rv = self.rv

    def _record(self, change_type: str, resource: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        change = Change(self.rv, change_type, resource, obj, old)
        self.history.append(change)
        while len(self.history) > self.history_size:
            self.compacted_rv = self.history.popleft().rv
        for listener in list(self._listeners):
            listener(change)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._objects[resource].get((namespace or "", name))
        if obj is None:
            raise StatusError(404, "NotFound", f'{resource} "{name}" not found')
        return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None, field_selector: str = "",
             label_selector: str = "") -> tuple[list[dict[str, Any]], int]:
        fields = parse_field_selector(field_selector)
        labels = parse_label_selector(label_selector)
        items = [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self._objects[resource].items())
            if (namespace is None or ns == namespace) and matches(obj, fields, labels)
        ]
        return items, self.rv

    # -- writes ---------------------------------------------------------------------------------

    def create(self, resource: str, namespace: str | None, obj: Any) -> dict[str, Any]:
        info = RESOURCES[resource]
        if not isinstance(obj, dict):
            raise StatusError(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise StatusError(400, "BadRequest", "metadata must be an object")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta.get("name")
        if not name or not isinstance(name, str):
            raise StatusError(422, "Invalid", f"{info.kind}: metadata.name: Required value")
        if info.namespaced:
            body_ns = meta.get("namespace")
            namespace = namespace or body_ns or "default"
            if body_ns and body_ns != namespace:
                raise StatusError(400, "BadRequest",
                                  "the namespace of the object does not match the namespace of the request")
            meta["namespace"] = namespace
        else:
            namespace = ""
        key = (namespace, name)
        if info.stored and key in self._objects[resource]:
            raise StatusError(409, "AlreadyExists", f'{resource} "{name}" already exists')
        obj["apiVersion"] = info.api_version
        obj["kind"] = info.kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp(self._clock())
        meta.pop("deletionTimestamp", None)
        meta["resourceVersion"] = self._next_rv()
        if resource == "pods":
            obj["status"] = stored_pod_status(obj.get("status"), self.minor)
            obj["status"].setdefault("phase", "Pending")
            if self.minor >= 33:
                meta["generation"] = 1  # pods have one since 1.33
        if resource == "events":
            self.received_events.append(obj)
        if not info.stored:
            return copy.deepcopy(obj)
        self._objects[resource][key] = obj
        self._record("ADDED", resource, obj, None)
        return copy.deepcopy(obj)

    def replace(self, resource: str, namespace: str | None, name: str, obj: Any, subresource: str = "") -> dict[str,
                                                                                                                Any]:
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            raise StatusError(400, "BadRequest", "the body must be a JSON object with metadata")
        body_name = (obj.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise StatusError(400, "BadRequest", "the name of the object does not match the name in the URL")
        return self._update(resource, namespace, name, lambda old: copy.deepcopy(obj), subresource)

    def patch(self, resource: str, namespace: str | None, name: str, patch_type: str, body: Any,
              subresource: str = "") -> dict[str, Any]:
        apply = {"strategic": strategic_merge, "merge": json_merge, "json": json_patch}[patch_type]

        def patched(old: dict[str, Any]) -> dict[str, Any]:
            try:
                return apply(old, body)
            except StrategicMergePanic:
                raise  # the server's answer is a dropped connection, not a Status
            except PatchError as e:
                raise StatusError(422, "Invalid", f"the patch cannot be applied: {e}") from None

        return self._update(resource, namespace, name, patched, subresource)

    def _update(self, resource: str, namespace: str | None, name: str, make_new: Callable[[dict[str, Any]], Any],
                subresource: str) -> dict[str, Any]:
        info = RESOURCES[resource]
        key = (namespace or "", name)
        old = self._objects[resource].get(key)
        if old is None:
            raise StatusError(404, "NotFound", f'{resource} "{name}" not found')
        new = make_new(copy.deepcopy(old))
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise StatusError(422, "Invalid", "the result is not an object with metadata")
        new_meta = new.get("metadata") or {}
        old_meta = old["metadata"]
        if new_meta.get("uid") and new_meta["uid"] != old_meta["uid"]:
            raise StatusError(409, "Conflict",
                              f"Precondition failed: UID in precondition: {new_meta['uid']}, "
                              f"UID in object meta: {old_meta['uid']}")
        if new_meta.get("resourceVersion") and new_meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise StatusError(409, "Conflict",
                              f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
                              "please apply your changes to the latest version and try again")
        if subresource == "status":
            result = copy.deepcopy(old)
            result["status"] = new.get("status") or {}
        elif subresource == "resize":
            result = resized_pod(old, new, self.minor)
        else:
            result = new
            if info.has_status:
                result["status"] = copy.deepcopy(old.get("status") or {})
            meta = result.setdefault("metadata", {})
            for immutable in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds"):
                if immutable in old_meta:
                    meta[immutable] = old_meta[immutable]
                else:
                    meta.pop(immutable, None)
        if resource == "pods":
            result["status"] = stored_pod_status(result.get("status"), self.minor)
            if self.minor >= 33 and result.get("spec") != old.get("spec"):
                result["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        result["apiVersion"] = info.api_version
        result["kind"] = info.kind
        result["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if result == old:
            return copy.deepcopy(old)  # a no-op write neither bumps the resourceVersion nor notifies
        result["metadata"]["resourceVersion"] = self._next_rv()
        self._objects[resource][key] = result
        self._record("MODIFIED", resource, result, old)
        return copy.deepcopy(result)

    def delete(self, resource: str, namespace: str | None, name: str, options: Any = None) -> dict[str, Any]:
        """Pods bound to a node are deleted gracefully (deletionTimestamp first) unless the grace
        period is 0; every other object goes at once."""
        options = options if isinstance(options, dict) else {}
        key = (namespace or "", name)
        old = self._objects[resource].get(key)
        if old is None:
            raise StatusError(404, "NotFound", f'{resource} "{name}" not found')
        old_meta = old["metadata"]
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != old_meta["uid"]:
            raise StatusError(409, "Conflict",
                              f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                              f"UID in object meta: {old_meta['uid']}")
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != old_meta["resourceVersion"]:
            raise StatusError(409, "Conflict",
                              "Precondition failed: ResourceVersion in precondition: "
                              f"{preconditions['resourceVersion']}, "
                              f"ResourceVersion in object meta: {old_meta['resourceVersion']}")
        grace = options.get("gracePeriodSeconds")
        if resource == "pods" and (grace is None or grace > 0):
            graceful = self._mark_pod_deleting(key, old, grace)
            if graceful is not None:
                return graceful
        del self._objects[resource][key]
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._record("DELETED", resource, gone, old)
        return copy.deepcopy(gone)

    def _mark_pod_deleting(self, key: tuple[str, str], old: dict[str, Any], grace: int | None) -> dict[str, Any] | None:
        """Set deletionTimestamp on a running pod; None when the pod should go at once."""
        spec = old.get("spec") or {}
        phase = (old.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return None
        meta = old["metadata"]
        if grace is None:
            grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30))
        if grace <= 0:
            return None
        current = meta.get("deletionGracePeriodSeconds")
        if current is not None and current <= grace:
            return copy.deepcopy(old)  # already deleting with an equal or shorter grace period
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = timestamp(self._clock() + grace)
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._objects["pods"][key] = new
        self._record("MODIFIED", "pods", new, old)
        return copy.deepcopy(new)


# -- selectors ----------------------------------------------------------------------------------

Requirement = tuple[str, str, frozenset[str]]  # (key, operator, values)


def parse_field_selector(text: str) -> list[Requirement]:
    """`a=b,c!=d` (also `==`) on dotted field paths such as spec.nodeName or metadata.name."""
    requirements = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        match = re.fullmatch(r"([A-Za-z0-9_.\-/]+)\s*(==|!=|=)\s*(.*)", term)
        if not match:
            raise StatusError(400, "BadRequest", f"invalid field selector term {term!r}")
        key, op, value = match.groups()
        requirements.append(("field:" + key, "!=" if op == "!=" else "=", frozenset([value])))
    return requirements


def parse_label_selector(text: str) -> list[Requirement]:
    """`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined by commas."""
    requirements = []
    for term in _split_terms(text or ""):
        if match := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = match.groups()
            requirements.append((key, op, frozenset(v.strip() for v in values.split(",") if v.strip())))
        elif match := re.fullmatch(r"([\w./-]+)\s*(==|!=|=)\s*([\w.-]*)", term):
            key, op, value = match.groups()
            requirements.append((key, "!=" if op == "!=" else "=", frozenset([value])))
        elif match := re.fullmatch(r"(!?)([\w./-]+)", term):
            requirements.append((match.group(2), "!exists" if match.group(1) else "exists", frozenset()))
        else:
            raise StatusError(400, "BadRequest", f"invalid label selector term {term!r}")
    return requirements


def _split_terms(text: str) -> Iterable[str]:
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            if text[start:i].strip():
                yield text[start:i].strip()
            start = i + 1
    if text[start:].strip():
        yield text[start:].strip()


def matches(obj: dict[str, Any], fields: list[Requirement], labels: list[Requirement]) -> bool:
    object_labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, values in fields:
        value = _field_value(obj, key[len("field:"):])
        if (value in values) != (op == "="):
            return False
    for key, op, values in labels:
        present = key in object_labels
        value = object_labels.get(key)
        ok = {
            "=": present and value in values,
            "!=": not present or value not in values,
            "in": present and value in values,
            "notin": not present or value not in values,
            "exists": present,
            "!exists": not present,
        }[op]
        if not ok:
            return False
    return True


def _field_value(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)
