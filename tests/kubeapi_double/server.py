"""A real HTTP/1.1 Kubernetes API server double on 127.0.0.1, run in a background thread.

Requests are parsed with h11 and served from `Store`; test controls (failures, outages, broken
watch streams) and object helpers are thread-safe methods that run on the server's own loop.
See docs/api-double.md for the API semantics it implements.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11
import orjson
import yaml

from tests.kubeapi_double import ephemeral
from tests.kubeapi_double.admission import check_node_pod_list, check_node_write
from tests.kubeapi_double.patch import PatchError, StrategicMergePanic, json_merge, json_patch, strategic_merge
from tests.kubeapi_double.routing import PATCH_TYPES, Route, decode_body, parse_route, reason_for, translate
from tests.kubeapi_double.schema import CURRENT_MINOR, server_version
from tests.kubeapi_double.store import RESOURCES, Change, StatusError, Store, parse_field_selector, parse_label_selector

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
REVIEW_PATHS = frozenset({TOKEN_REVIEW_PATH, "/apis/authorization.k8s.io/v1/subjectaccessreviews"})


@dataclass(frozen=True, slots=True)
class RequestRecord:
    time: float  # time.monotonic() when the request arrived
    method: str
    path: str
    query: dict[str, str]


@dataclass
class _FailureRule:
    remaining: int
    status: int  # 0: drop the connection without an answer
    path_prefix: str
    method: str | None


class _Watch:
    """One open watch stream: pending items and a wake-up event, filled from the store listener."""

    def __init__(self) -> None:
        self.items: collections.deque[tuple[str, Any]] = collections.deque()
        self.wake = asyncio.Event()

    def push(self, kind: str, value: Any = None) -> None:
        self.items.append((kind, value))
        self.wake.set()


class ApiServerDouble:
    """Start with `with ApiServerDouble() as api:`; `api.url` is the server's base URL."""

    def __init__(
        self,
        *,
        token: str | None = None,
        history_size: int = 1000,
        bookmark_interval: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
        gone_as_http: bool = False,
        node_name: str | None = None,
        admin_token: str | None = None,
        server_minor: int = CURRENT_MINOR,
    ):
        """`node_name`: requests over HTTP come from that node (user system:node:<name>), so the
        NodeRestriction admission plugin and the Node authorizer's write rules answer 403 as they would;
        requests bearing `admin_token` come from a cluster admin instead. `server_minor`: the release it answers
        as (1.36 by default; what a pod status keeps and whether pods/resize exists depend on it)."""
        self.token = token
        self.node_name = node_name
        self.admin_token = admin_token
        self.bookmark_interval = bookmark_interval
        self.gone_as_http = gone_as_http
        self.port = 0
        # Reviews the kubelet API asks for: token -> (user, groups); a SubjectAccessReview spec -> allowed.
        self.token_users: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.authorize: Callable[[dict[str, Any]], bool] = lambda spec: False
        # What kube-controller-manager's approver and signer do to a new CertificateSigningRequest: the status
        # it gets (conditions, certificate), or None to leave it pending.
        self.csr_signer: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
        self.panics: list[str] = []  # requests that would have made kube-apiserver panic
        self._ssl = ssl_context
        self._store = Store(history_size=history_size, minor=server_minor)
        self._version = server_version(server_minor)
        self._rules: list[_FailureRule] = []
        self._requests: list[RequestRecord] = []
        self._writes: collections.Counter[tuple[str, str]] = collections.Counter()
        self._watches: set[_Watch] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kubeapi-double", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> ApiServerDouble:
        self._thread.start()
        self._run(self._listen())
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ApiServerDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def go_down(self) -> None:
        """An API outage: stop listening and cut every open connection (clients get refused)."""
        self._run(self._go_down())

    def come_up(self) -> None:
        """End the outage: listen again on the same port with the same objects."""
        self._run(self._listen())

    def restart(self) -> None:
        """An API server restart: connections cut, and the new watch cache knows no history, so a watch
        from an older resourceVersion gets 410 "too old resource version" and must list again."""
        self._run(self._go_down())
        self._call(self._store.compact)
        self._run(self._listen())

    def drop_connections(self) -> None:
        """Cut every open connection (watches included) but keep listening."""
        self._call(self._abort_connections)

    # -- failure injection --------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500, *, path_prefix: str = "", method: str | None = None) -> None:
        """Answer the next `count` matching requests with `status` (0: close without answering)."""
        self._call(self._rules.append, _FailureRule(count, status, path_prefix, method))

    def inject_watch_garbage(self, data: bytes = b"this is not a watch event\n") -> None:
        """Write raw bytes into every open watch stream."""
        self._call(self._push_all, "raw", data)

    def truncate_watches(self) -> None:
        """End every open watch stream cleanly in the middle of an event line."""
        self._call(self._push_all, "truncate")

    def expire_watches(self) -> None:
        """Send an ERROR 410 Expired event on every open watch and end it, as after compaction."""
        self._call(self._push_all, "expire")

    def compact(self) -> None:
        """Forget the change history: watches from an older resourceVersion get 410 Gone."""
        self._call(self._store.compact)

    # -- observation --------------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        return self._call(list, self._requests)

    def write_count(self, method: str, path: str) -> int:
        """How many `method` requests arrived for `path` (answered or failed)."""
        return self._call(self._writes.get, (method, path), 0)

    @property
    def active_watches(self) -> int:
        return self._call(len, self._watches)

    @property
    def resource_version(self) -> int:
        return self._call(lambda: self._store.rv)

    @property
    def received_events(self) -> list[dict[str, Any]]:
        return self._call(list, self._store.received_events)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met in time")
            time.sleep(0.005)

    # -- objects, bypassing HTTP ----------------------------------------------------------------

    def create(self, resource: str, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self._call(self._store.create, resource, self._ns(resource, namespace, obj), obj)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._call(self._store.get, resource, self._ns(resource, namespace), name)

    def list(self, resource: str, namespace: str | None = None, field_selector: str = "") -> list[dict[str, Any]]:
        return self._call(self._store.list, resource, namespace, field_selector)[0]

    def replace(self, resource: str, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self._call(self._store.replace, resource, self._ns(resource, namespace, obj), obj["metadata"]["name"],
                          obj)

    def patch(self, resource: str, name: str, body: Any, *, patch_type: str = "strategic",
              namespace: str | None = None, subresource: str = "") -> dict[str, Any]:
        return self._call(self._store.patch, resource, self._ns(resource, namespace), name, patch_type, body,
                          subresource)

    def delete(self, resource: str, name: str, namespace: str | None = None,
               grace_period: int | None = None) -> dict[str, Any]:
        options = {} if grace_period is None else {"gracePeriodSeconds": grace_period}
        return self._call(self._store.delete, resource, self._ns(resource, namespace), name, options)

    def write_kubeconfig(self, path: str, *, token: str | None = None, ca_pem: bytes | None = None,
                         client_cert_pem: bytes | None = None, client_key_pem: bytes | None = None) -> str:
        """A kubeconfig pointing at this server (credentials inline), for code that loads one."""
        cluster: dict[str, Any] = {"server": self.url}
        if ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
        user: dict[str, Any] = {}
        if token:
            user["token"] = token
        if client_cert_pem and client_key_pem:
            user["client-certificate-data"] = base64.b64encode(client_cert_pem).decode()
            user["client-key-data"] = base64.b64encode(client_key_pem).decode()
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": cluster}],
            "users": [{"name": "double", "user": user}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double"}}],
        }
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
        return path

    @staticmethod
    def _ns(resource: str, namespace: str | None, obj: dict[str, Any] | None = None) -> str | None:
        if not RESOURCES[resource].namespaced:
            return None
        return namespace or ((obj or {}).get("metadata") or {}).get("namespace") or "default"

    # -- running on the server loop -----------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)

        return self._run(call())

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._handle_connection, "127.0.0.1", self.port, ssl=self._ssl,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _go_down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._abort_connections()

    async def _shutdown(self) -> None:
        await self._go_down()
        if self._tasks:
            # Aborted connections end their handlers; cancelling is the fallback for stragglers.
            _, pending = await asyncio.wait(set(self._tasks), timeout=2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _abort_connections(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    def _push_all(self, kind: str, value: Any = None) -> None:
        for watch in self._watches:
            watch.push(kind, value)

    # -- HTTP ---------------------------------------------------------------------------------

    async def _handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(conn, reader)
                if request is None:
                    break
                method, target, headers, body = request
                if not await self._answer(conn, reader, writer, method, target, headers, body):
                    break
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError, OSError):
            pass
        except asyncio.CancelledError:
            pass  # shutdown; a cancelled handler task would upset asyncio's stream callback
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[str, str,
                                                                                               dict[str, str],
                                                                                               bytes] | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                return request.method.decode(), request.target.decode(), headers, bytes(body)
            elif isinstance(event, (h11.ConnectionClosed, h11.PAUSED)):
                return None

    async def _answer(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      method: str, target: str, headers: dict[str, str], body: bytes) -> bool:
        """Serve one request; False when the connection must be dropped."""
        split = urlsplit(target)
        path = split.path
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        self._requests.append(RequestRecord(time.monotonic(), method, path, query))
        if method in WRITE_METHODS:
            self._writes[(method, path)] += 1
        rule = self._matching_rule(method, path)
        if rule is not None:
            if rule.status == 0:
                return False
            await self._send_json(conn, writer, rule.status,
                                  StatusError(rule.status, reason_for(rule.status), "injected failure").status())
            return True
        authorization = headers.get("authorization")
        admin = self.admin_token is not None and authorization == f"Bearer {self.admin_token}"
        if self.token is not None and authorization != f"Bearer {self.token}" and not admin:
            await self._send_json(conn, writer, 401, StatusError(401, "Unauthorized", "Unauthorized").status())
            return True
        try:
            if path in ("/healthz", "/readyz", "/livez"):
                await self._send(conn, writer, 200, b"ok", "text/plain")
                return True
            if path == "/version":
                await self._send_json(conn, writer, 200, self._version)
                return True
            if method == "POST" and path in REVIEW_PATHS:
                await self._send_json(conn, writer, 201, self._review(path, decode_body(body)))
                return True
            route = parse_route(path)
            if route is None:
                raise StatusError(404, "NotFound", f"the server could not find the requested resource ({path})")
            as_node = None if admin else self.node_name
            watch = query.get("watch") in ("true", "1")
            if (as_node is not None and method == "GET" and route.name is None and route.resource.plural == "pods"
                    and self._store.minor >= 32):
                check_node_pod_list(as_node, "watch" if watch else "list", route.namespace,
                                    query.get("fieldSelector", ""))
            if method == "GET" and route.name is None and watch:
                return await self._serve_watch(conn, reader, writer, route, query)
            code, result = self._dispatch(method, route, query, headers, body, as_node=as_node)
            await self._send_json(conn, writer, code, result)
        except StatusError as e:
            await self._send_json(conn, writer, e.code, e.status())
        except StrategicMergePanic as e:
            self.panics.append(f"{method} {path}: {e}")
            return False  # kube-apiserver's handler panics: the client sees the connection dropped
        return True

    def _review(self, path: str, review: Any) -> dict[str, Any]:
        """TokenReview from `token_users`; SubjectAccessReview by `authorize(spec)` (deny all by default)."""
        spec = review.get("spec") or {}
        if path == TOKEN_REVIEW_PATH:
            user = self.token_users.get(spec.get("token", ""))
            status: dict[str, Any] = {"authenticated": False}
            if user is not None:
                status = {"authenticated": True, "user": {"username": user[0], "groups": list(user[1])}}
        else:
            allowed = bool(self.authorize(spec))
            status = {"allowed": allowed, "reason": "allowed by the test" if allowed else ""}
        return {**review, "status": status}

    def _matching_rule(self, method: str, path: str) -> _FailureRule | None:
        for rule in self._rules:
            if rule.remaining > 0 and path.startswith(rule.path_prefix) and rule.method in (None, method):
                rule.remaining -= 1
                if rule.remaining == 0:
                    self._rules.remove(rule)
                return rule
        return None

    def _dispatch(self, method: str, route: Route, query: dict[str, str], headers: dict[str, str], body: bytes,
                  *, as_node: str | None) -> tuple[int, Any]:
        store = self._store
        plural = route.resource.plural
        if as_node is not None and method in WRITE_METHODS:
            obj = decode_body(body) if body and method in ("POST", "PUT") else None
            check_node_write(as_node, method, plural, route.namespace, route.name, route.subresource, obj, store.get)
        if route.subresource == "ephemeralcontainers":
            return 200, self._ephemeral_containers(method, route, headers, body)
        if route.name is None:
            if method == "GET":
                items, rv = store.list(plural, route.namespace, query.get("fieldSelector", ""),
                                       query.get("labelSelector", ""))
                for item in items:
                    item.pop("apiVersion", None)
                    item.pop("kind", None)
                return 200, {"kind": f"{route.resource.kind}List", "apiVersion": route.resource.api_version,
                             "metadata": {"resourceVersion": str(rv)}, "items": items}
            if method == "POST":
                created = store.create(plural, route.namespace, decode_body(body))
                if plural == "certificatesigningrequests" and self.csr_signer is not None:
                    status = self.csr_signer(created)
                    if status is not None:
                        created = store.patch(plural, None, created["metadata"]["name"], "merge", {"status": status},
                                              "status")
                return 201, created
        else:
            if method == "GET":
                return 200, store.get(plural, route.namespace, route.name)
            if method == "PUT":
                return 200, store.replace(plural, route.namespace, route.name, decode_body(body), route.subresource)
            if method == "PATCH":
                content_type = headers.get("content-type", "").split(";")[0].strip()
                if content_type not in PATCH_TYPES:
                    raise StatusError(415, "UnsupportedMediaType",
                                      f"the body of the request was in an unknown format: {content_type}")
                return 200, store.patch(plural, route.namespace, route.name, PATCH_TYPES[content_type],
                                        decode_body(body), route.subresource)
            if method == "DELETE" and not route.subresource:
                return 200, store.delete(plural, route.namespace, route.name, decode_body(body) if body else None)
        raise StatusError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _ephemeral_containers(self, method: str, route: Route, headers: dict[str, str], body: bytes) -> dict[str, Any]:
        """pods/NAME/ephemeralcontainers: read, replace or patch the subresource's object (kubectl debug)."""
        pod = self._store.get("pods", route.namespace, route.name)
        if method == "GET":
            return ephemeral.view(pod)
        if method == "PUT":
            written = decode_body(body)
        elif method == "PATCH":
            content_type = headers.get("content-type", "").split(";")[0].strip()
            if content_type not in PATCH_TYPES:
                raise StatusError(415, "UnsupportedMediaType",
                                  f"the body of the request was in an unknown format: {content_type}")
            apply = {"strategic": strategic_merge, "merge": json_merge, "json": json_patch}[PATCH_TYPES[content_type]]
            try:
                written = apply(ephemeral.view(pod), decode_body(body))
            except PatchError as e:
                raise StatusError(422, "Invalid", f"the patch cannot be applied: {e}") from None
        else:
            raise StatusError(405, "MethodNotAllowed", f"{method} is not supported here")
        stored = self._store.replace("pods", route.namespace, route.name, ephemeral.updated_pod(pod, written))
        return ephemeral.view(stored)

    async def _serve_watch(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           route: Route, query: dict[str, str]) -> bool:
        store = self._store
        fields = parse_field_selector(query.get("fieldSelector", ""))
        labels = parse_label_selector(query.get("labelSelector", ""))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(query.get("timeoutSeconds") or 0) or None
        start = query.get("resourceVersion", "")
        watch = _Watch()
        initial: list[tuple[str, dict[str, Any]]] = []
        backlog: list[Change] = []
        expired: StatusError | None = None
        if start in ("", "0"):
            items, _ = store.list(route.resource.plural, route.namespace, query.get("fieldSelector", ""),
                                  query.get("labelSelector", ""))
            initial = [("ADDED", item) for item in items]
        else:
            try:
                backlog = store.changes_since(int(start))
            except ValueError:
                raise StatusError(400, "BadRequest", f"invalid resourceVersion {start!r}") from None
            except StatusError as e:
                if e.code != 410 or self.gone_as_http:
                    raise
                expired = e
        # Subscribing in the same step as reading the backlog: no change can fall in between.
        unsubscribe = store.subscribe(lambda change: watch.push("change", change))
        self._watches.add(watch)
        closed = asyncio.ensure_future(reader.read(1))
        try:
            # One stream per connection: the disconnect probe below reads from the socket.
            writer.write(conn.send(h11.Response(status_code=200,
                                                headers=[("content-type", "application/json"),
                                                         ("connection", "close")])))
            if expired is not None:
                await self._send_event(conn, writer, "ERROR", expired.status())
                writer.write(conn.send(h11.EndOfMessage()))
                return True
            for kind, obj in initial:
                await self._send_event(conn, writer, kind, obj)
            for change in backlog:
                watch.push("change", change)
            deadline = None if timeout is None else self._loop.time() + timeout
            last_bookmark = self._loop.time()
            while True:
                while watch.items:
                    kind, value = watch.items.popleft()
                    if kind == "change":
                        event = translate(change=value, route=route, fields=fields, labels=labels)
                        if event is not None:
                            await self._send_event(conn, writer, *event)
                    elif kind == "raw":
                        writer.write(conn.send(h11.Data(data=value)))
                    elif kind == "truncate":
                        writer.write(conn.send(h11.Data(data=b'{"type":"MODIFIED","object":{"metadata":')))
                        writer.write(conn.send(h11.EndOfMessage()))
                        return True
                    elif kind == "expire":
                        await self._send_event(conn, writer, "ERROR",
                                               StatusError(410, "Expired", "the watch has expired").status())
                        writer.write(conn.send(h11.EndOfMessage()))
                        return True
                now = self._loop.time()
                if deadline is not None and now >= deadline:
                    writer.write(conn.send(h11.EndOfMessage()))
                    return True
                if bookmarks and now - last_bookmark >= self.bookmark_interval:
                    last_bookmark = now
                    await self._send_event(conn, writer, "BOOKMARK", {
                        "kind": route.resource.kind, "apiVersion": route.resource.api_version,
                        "metadata": {"resourceVersion": str(store.rv)}})
                waits = [w for w in (None if deadline is None else deadline - now,
                                     self.bookmark_interval - (now - last_bookmark) if bookmarks else None)
                         if w is not None]
                watch.wake.clear()
                woken = asyncio.ensure_future(watch.wake.wait())
                done, _ = await asyncio.wait({woken, closed}, timeout=max(min(waits), 0) if waits else None,
                                             return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if closed in done:
                    return False
        finally:
            closed.cancel()
            await asyncio.gather(closed, return_exceptions=True)
            unsubscribe()
            self._watches.discard(watch)

    async def _send_event(self, conn: h11.Connection, writer: asyncio.StreamWriter, kind: str,
                          obj: dict[str, Any]) -> None:
        writer.write(conn.send(h11.Data(data=orjson.dumps({"type": kind, "object": obj}) + b"\n")))
        await writer.drain()

    async def _send_json(self, conn: h11.Connection, writer: asyncio.StreamWriter, code: int, obj: Any) -> None:
        await self._send(conn, writer, code, orjson.dumps(obj), "application/json")

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, code: int, data: bytes,
                    content_type: str) -> None:
        headers = [("content-type", content_type), ("content-length", str(len(data)))]
        writer.write(conn.send(h11.Response(status_code=code, headers=headers)))
        writer.write(conn.send(h11.Data(data=data)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
