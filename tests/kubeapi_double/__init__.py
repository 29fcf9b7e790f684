"""A Kubernetes API server double for tests: real HTTP on 127.0.0.1, in-memory objects, watch
semantics (resourceVersion, bookmarks, timeouts, 410 Gone) and failure controls."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from tests.kubeapi_double.routing import Route, parse_route
from tests.kubeapi_double.server import ApiServerDouble, RequestRecord
from tests.kubeapi_double.store import RESOURCES, StatusError, Store


async def eventually(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.01) -> None:
    """Wait (without blocking the loop) until `predicate()` is true; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(interval)


__all__ = ["ApiServerDouble", "RESOURCES", "RequestRecord", "Route", "StatusError", "Store", "eventually", "parse_route"]
