"""Async client for the Kubernetes REST API on edgelet.util.http11 (HTTP/1.1, keep-alive, timeouts).

Requests return decoded JSON dicts; failures raise the types of `edgelet.kubeapi.errors`.
`watch` streams line-delimited JSON events and turns ERROR events into exceptions.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import platform
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from edgelet import __version__
from edgelet.kubeapi.errors import ApiError, Gone, ServerError, WatchStreamError, error_from_status
from edgelet.kubeapi.kubeconfig import KubeConfig, load_kubeconfig, read_token_file, ssl_context
from edgelet.util.http11 import HttpError, HttpTimeout, Pool, target

PATCH_CONTENT_TYPES = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}
WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})

# A watch event is one object; anything this long without a newline is not a Kubernetes stream.
_MAX_WATCH_LINE = 16 * 1024 * 1024
# A watch without a server timeout still needs a bound on silence to notice dead connections.
_DEFAULT_WATCH_SECONDS = 300
_WATCH_READ_SLACK = 30.0
_TOKEN_FILE_RELOAD_SECONDS = 60.0


class BearerAuth:
    """Adds `Authorization: Bearer ...`; a token file is re-read each minute so rotated tokens work."""

    def __init__(self, token: str | None, token_file: str | None = None, *, kubeconfig_path: str = "", field: str = ""):
        self._token = token
        self._token_file = token_file
        self._kubeconfig_path = kubeconfig_path
        self._field = field
        self._loaded_at = time.monotonic()

    def __repr__(self) -> str:
        return "BearerAuth(<redacted>)"

    def _current(self) -> str | None:
        if self._token_file and time.monotonic() - self._loaded_at > _TOKEN_FILE_RELOAD_SECONDS:
            self._loaded_at = time.monotonic()
            try:
                self._token = read_token_file(self._token_file, self._kubeconfig_path, self._field)
            except Exception:  # noqa: BLE001 - keep the last good token; the server tells us if it expired
                pass
        return self._token

    def headers(self) -> list[tuple[str, str]]:
        token = self._current()
        return [("Authorization", f"Bearer {token}")] if token else []


class ApiClient:
    """One connection pool to one API server. Paths are absolute API paths (`/api/v1/...`)."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        tls: Any = None,
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        kubeconfig_path: str = "",
    ):
        self.server = server.rstrip("/")
        self._prefix = urlsplit(self.server).path
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._auth = BearerAuth(token, token_file, kubeconfig_path=kubeconfig_path,
                                field="tokenFile") if token or token_file else None
        self._http = self._new_http(tls)
        # Pools replaced by `use_tls`, with the number of requests and watches still running on each.
        self._in_flight: dict[Pool, int] = {}

    def _new_http(self, tls: ssl.SSLContext | None) -> Pool:
        """A pool to the server; with no context an https server is verified against the system's CAs."""
        return Pool(self.server, tls=tls, connect_timeout=self._connect_timeout, max_idle=5, keepalive_expiry=60.0,
                    headers=[("Accept", "application/json"),
                             ("User-Agent",
                              f"edgelet/{__version__} ({platform.system().lower()}/{platform.machine()})")])

    def use_tls(self, tls: ssl.SSLContext) -> None:
        """New connections use `tls` (a rotated client certificate). Requests and watches already running
        finish on their connections, which close when the last of them ends: a rotation drops no watch."""
        old, self._http = self._http, self._new_http(tls)
        if not self._in_flight.get(old):
            _close_later(old)

    @contextlib.asynccontextmanager
    async def _pool(self) -> AsyncIterator[Pool]:
        http = self._http
        self._in_flight[http] = self._in_flight.get(http, 0) + 1
        try:
            yield http
        finally:
            left = self._in_flight.get(http, 1) - 1  # absent: aclose() already closed every pool
            if left:
                self._in_flight[http] = left
            else:
                self._in_flight.pop(http, None)
                if http is not self._http:
                    _close_later(http)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: KubeConfig | str, *, context: str | None = None,
                        timeout: float = 10.0) -> ApiClient:
        config = load_kubeconfig(kubeconfig, context=context) if isinstance(kubeconfig, str) else kubeconfig
        return cls(
            config.server,
            token=config.token,
            token_file=config.token_file,
            tls=ssl_context(config),
            timeout=timeout,
            kubeconfig_path=config.path,
        )

    def __repr__(self) -> str:
        return f"ApiClient(server={self.server!r})"

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for http in {*self._in_flight, self._http}:
            await http.aclose()
        self._in_flight.clear()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self._request("GET", path, params=params)

    async def list(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A list response: `items` plus `metadata.resourceVersion` to watch from."""
        result = await self._request("GET", path, params=params)
        if not isinstance(result.get("items", []), list):
            raise ServerError(200, "InvalidResponse", "list response has no items list", method="GET", path=path)
        return result

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, body=orjson.dumps(obj), content_type="application/json")

    async def replace(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT; the object's metadata.resourceVersion makes it conditional (409 Conflict if stale)."""
        return await self._request("PUT", path, body=orjson.dumps(obj), content_type="application/json")

    async def patch(self, path: str, body: Any, patch_type: str = "strategic") -> dict[str, Any]:
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"patch_type must be one of {sorted(PATCH_CONTENT_TYPES)}, not {patch_type!r}") from None
        return await self._request("PATCH", path, body=orjson.dumps(body), content_type=content_type)

    async def delete(self, path: str, preconditions_uid: str | None = None,
                     grace_period: int | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions_uid:
            options["preconditions"] = {"uid": preconditions_uid}
        if grace_period is not None:
            options["gracePeriodSeconds"] = int(grace_period)
        return await self._request("DELETE", path, body=orjson.dumps(options), content_type="application/json")

    async def watch(self, path: str,
                    params: Mapping[str, str] | None = None) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """Yield `(type, object)` events. ERROR events raise (`Gone` for 410); a clean end of the
        stream (server timeout) just ends the iteration. Close it with `contextlib.aclosing`."""
        query = dict(params or {})
        query["watch"] = "true"
        server_seconds = float(query.get("timeoutSeconds") or _DEFAULT_WATCH_SECONDS)
        try:
            async with self._pool() as http, http.stream("GET", target(self._path(path), query),
                                                         headers=self._auth_headers(),
                                                         timeout=server_seconds + _WATCH_READ_SLACK) as response:
                if response.status != 200:
                    raise error_from_status(response.status, _json_or_none(await response.read()), method="WATCH",
                                            path=path)
                async for event in _decode_events(response.chunks, path):
                    yield event
        except HttpTimeout:
            raise ServerError(0, "Timeout", "no data from the watch stream in time", method="WATCH",
                              path=path) from None
        except HttpError as e:
            raise ServerError(0, "StreamBroken", _transport_message(e), method="WATCH", path=path) from None

    def _path(self, path: str) -> str:
        """The request target of an API path on this server (a server URL may carry a path prefix)."""
        return self._prefix + path

    def _auth_headers(self) -> builtins.list[tuple[str, str]]:  # (`list` is a method here)
        return self._auth.headers() if self._auth is not None else []

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = self._auth_headers()
        if content_type:
            headers.append(("Content-Type", content_type))
        try:
            async with self._pool() as http:
                response = await http.request(method, target(self._path(path), params), headers=headers,
                                              body=body or b"", timeout=self._timeout)
        except HttpTimeout:
            raise ServerError(0, "Timeout", f"no answer within {self._timeout:g}s", method=method, path=path) from None
        except HttpError as e:
            raise ServerError(0, "ConnectionError", _transport_message(e), method=method, path=path) from None
        decoded = _json_or_none(response.body)
        if not 200 <= response.status < 300:
            raise error_from_status(response.status, decoded, method=method, path=path)
        if not isinstance(decoded, dict):
            raise ServerError(response.status, "InvalidResponse", "the response is not a JSON object", method=method,
                              path=path)
        return decoded


def _close_later(http: Pool) -> None:
    """Close a replaced pool without making its caller wait (nothing is running on it any more)."""
    task = asyncio.get_running_loop().create_task(http.aclose())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task] = set()


async def _decode_events(chunks: AsyncIterator[bytes], path: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    buffer = bytearray()
    line_number = 0
    async for chunk in chunks:
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            line_number += 1
            if line.strip():
                yield parse_watch_line(line, path, line_number)
        if len(buffer) > _MAX_WATCH_LINE:
            raise WatchStreamError(0, "MalformedStream", f"line {line_number + 1} exceeds {_MAX_WATCH_LINE} bytes",
                                   method="WATCH", path=path)
    if buffer.strip():
        # Some servers end the last event without a newline; a complete object is still fine.
        try:
            event = parse_watch_line(bytes(buffer), path, line_number + 1)
        except WatchStreamError:
            raise WatchStreamError(0, "TruncatedStream", f"the stream ended inside event {line_number + 1}",
                                   method="WATCH", path=path) from None
        yield event


def parse_watch_line(line: bytes, path: str, line_number: int) -> tuple[str, dict[str, Any]]:
    """One watch event line -> (type, object); ERROR events become the matching ApiError."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise WatchStreamError(0, "MalformedStream", f"event {line_number} is not JSON ({e})", method="WATCH",
                               path=path) from None
    if not isinstance(event, dict):
        raise WatchStreamError(0, "MalformedStream", f"event {line_number} is not a JSON object", method="WATCH",
                               path=path)
    kind = event.get("type")
    obj = event.get("object")
    if kind not in WATCH_EVENT_TYPES or not isinstance(obj, dict):
        raise WatchStreamError(0, "MalformedStream", f"event {line_number} has no known type and object",
                               method="WATCH", path=path)
    if kind == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise Gone(410, str(obj.get("reason") or "Expired"), str(obj.get("message") or "resource version too old"),
                       method="WATCH", path=path)
        raise error_from_status(code if isinstance(code, int) and code >= 400 else 500, obj, method="WATCH", path=path)
    return kind, obj


def _json_or_none(content: bytes) -> Any:
    try:
        return orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        return None


def _transport_message(e: HttpError) -> str:
    return str(e) or type(e).__name__


__all__ = ["ApiClient", "ApiError", "BearerAuth", "PATCH_CONTENT_TYPES", "parse_watch_line"]
