"""URL routing and watch-event filtering of the API server double (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tests.kubeapi_double.store import EVENTS_V1, RESOURCES, Change, Resource, StatusError, matches

PATCH_TYPES = {
    "application/strategic-merge-patch+json": "strategic",
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
}


@dataclass(frozen=True, slots=True)
class Route:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str


def parse_route(path: str) -> Route | None:
    """`/api/v1[/namespaces/NS]/PLURAL[/NAME[/status]]` (pods also `/ephemeralcontainers`) and the same under
    `/apis/GROUP/VERSION`."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        api_version, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        return None
    resource = RESOURCES.get(rest[0])
    if resource is not None and resource.api_version != api_version:
        resource = EVENTS_V1 if (rest[0], api_version) == ("events", EVENTS_V1.api_version) else None
    if resource is None:
        return None
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and not ((subresource == "status" and resource.has_status)
                            or (subresource in ("ephemeralcontainers", "resize") and resource.plural == "pods")):
        return None
    if not resource.namespaced and namespace is not None:
        return None
    if resource.namespaced and name is not None and namespace is None:
        return None
    return Route(resource, namespace, name, subresource)


def translate(*, change: Change, route: Route, fields: list, labels: list) -> tuple[str, dict[str, Any]] | None:
    """What a filtered watch sees of a change: objects entering the selection are ADDED, those
    leaving it DELETED, as the API server reports them."""
    if change.resource != route.resource.plural:
        return None
    if route.namespace is not None and (change.obj.get("metadata") or {}).get("namespace") != route.namespace:
        return None
    now = matches(change.obj, fields, labels)
    before = change.old is not None and matches(change.old, fields, labels)
    if change.type == "ADDED":
        return ("ADDED", change.obj) if now else None
    if change.type == "DELETED":
        return ("DELETED", change.obj) if before or now else None
    if now and before:
        return "MODIFIED", change.obj
    if now:
        return "ADDED", change.obj
    if before:
        return "DELETED", change.obj
    return None


def decode_body(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise StatusError(400, "BadRequest", "the body is not valid JSON") from None


def reason_for(status: int) -> str:
    return {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Gone",
            429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}.get(status, "Unknown")
