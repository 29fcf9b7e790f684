"""A Kubernetes API server double for tests: real HTTP on 127.0.0.1, in-memory objects, watch
semantics (resourceVersion, bookmarks, timeouts, 410 Gone) and failure controls."""

from __future__ import annotations

from tests.kubeapi_double.routing import Route, parse_route
from tests.kubeapi_double.server import ApiServerDouble, RequestRecord
from tests.kubeapi_double.store import RESOURCES, StatusError, Store

__all__ = ["ApiServerDouble", "RESOURCES", "RequestRecord", "Route", "StatusError", "Store", "parse_route"]
