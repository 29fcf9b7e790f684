"""The kubelet API server: TLS on :10250, every request authenticated and authorized, then logs, exec,
attach, port-forward, run, stats, metrics, pods and healthz answered as the kubelet answers them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import orjson

from edgelet.cri import NotFound, RuntimeCallError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.logs.reader import LogsError, container_log_files, find_pod_dir
from edgelet.metrics.registry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgelet.server.http import HealthCheck, HttpServer, Reply, error_reply, healthz_reply, run_health_checks

from .auth import Attributes, Authenticator, Authorizer, forbidden_message
from .logs import read_logs
from .nodelogs import NotFound as LogPathNotFound
from .nodelogs import file_chunks, parse_node_log_query, query_chunks, read_path, resolve_file
from .paths import (
    BadRequest,
    Route,
    parse_log_options,
    parse_ports,
    parse_route,
    parse_stream_options,
    subresource_for,
    verb_for,
)
from .stats import resource_metrics
from .streaming import StreamingError, proxy_upgrade

log = logging.getLogger(__name__)

_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"
# A client that stops reading a log stream is dropped after this long rather than held forever.
_WRITE_TIMEOUT = 60.0


class NotFoundError(Exception):
    """The pod or container named in the path is not on this node (404)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the API reads from the rest of the agent, and nothing more."""

    node_name: str
    logs_dir: str
    runtime: Any
    find_container: Callable[[Route], str]  # -> a running container's id; raises NotFoundError / BadRequest
    find_sandbox: Callable[[Route], str]  # -> the pod's ready sandbox id; raises NotFoundError
    container_running: Callable[[str, str], bool]  # (pod uid, container name)
    pods_json: Callable[[], bytes]
    health_checks: Mapping[str, HealthCheck]
    summary: Callable[[], Awaitable[dict[str, Any]]]
    metrics: Callable[[], bytes]  # the agent's own registry (/metrics)
    probe_metrics: Callable[[], bytes]  # /metrics/probes
    cadvisor: Callable[[], Awaitable[bytes]]  # /metrics/cadvisor, made at each scrape
    node_log_dir: str  # what /logs/ serves
    journal_dir: str = ""  # the journal node log queries read; "" = the system journal


class KubeletApiServer(HttpServer):
    name = "kubelet API"

    def __init__(self, address: str, *, node: NodeView, authenticator: Authenticator, authorizer: Authorizer,
                 ssl_context: ssl.SSLContext, max_streams: int = 32, **limits: Any) -> None:
        super().__init__(address, ssl_context=ssl_context, **limits)
        self._tls = ssl_context  # always: the kubelet API is served over TLS only
        self._node = node
        self._authenticator = authenticator
        self._authorizer = authorizer
        self._streams = asyncio.Semaphore(max_streams)

    def trust_client_ca(self, ca_pem: bytes) -> None:
        """Client certificates from this CA are verified on new connections (a token join learns its CA late)."""
        self._tls.load_verify_locations(cadata=ca_pem.decode("ascii"))
        self._tls.verify_mode = ssl.CERT_OPTIONAL

    def reload_certificate(self, cert_file: str, key_file: str) -> None:
        """New connections get this certificate (a renewed serving certificate); open ones keep theirs."""
        self._tls.load_cert_chain(cert_file, key_file)

    async def respond(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      request: h11.Request) -> bool:
        method = request.method.decode("ascii", "replace")
        url = urlsplit(request.target.decode("ascii", "replace"))
        query = parse_qs(url.query, keep_blank_values=True)
        # A refused upgrade ends the connection: the client meant to leave HTTP behind on it.
        upgrade = any(name == b"upgrade" for name, _ in request.headers)
        refusal = await self._check_access(writer, request, method, url.path)
        route = parse_route(url.path)
        if refusal is not None or route is None:
            await self._send(conn, writer, method, refusal or error_reply(404, "page not found"), close=upgrade)
            return not upgrade
        try:
            if route.streaming or route.endpoint in ("containerLogs", "logs"):
                return await self._stream(conn, reader, writer, request, method, route, query, url.query)
            reply = await self._answer(method, route, query)
        except BadRequest as err:
            reply = error_reply(400, str(err))
        except (NotFoundError, NotFound, LogsError, LogPathNotFound) as err:
            reply = error_reply(404, str(err))
        except RuntimeCallError as err:
            reply = error_reply(500, f"container runtime: {err}")
        except (ConnectionError, TimeoutError):
            raise  # the caller went away or stopped reading: nobody to answer
        except Exception as err:
            log.exception("kubelet API %s %s failed", method, url.path)
            reply = error_reply(500, f"internal server error: {type(err).__name__}")
        close = upgrade or route.streaming
        await self._send(conn, writer, method, reply, close=close)
        return not close

    async def _check_access(self, writer: asyncio.StreamWriter, request: h11.Request, method: str,
                            path: str) -> Reply | None:
        """None when the caller may go on; else the 401, 403 or 500 reply."""
        authorization = next((v.decode("latin-1") for k, v in request.headers if k == b"authorization"), "")
        identity = await self._authenticator.authenticate(writer.get_extra_info("peercert"), authorization)
        if identity is None:
            return error_reply(401, "Unauthorized")
        attributes = Attributes(verb_for(method), self._node.node_name, subresource_for(path))
        try:
            decision = await self._authorizer.authorize(identity, attributes)
        except Exception as err:  # noqa: BLE001 - the API server could not be asked: not the caller's fault
            log.warning("kubelet API: SubjectAccessReview failed: %s", err)
            return error_reply(500, f"Authorization error (user={identity.user}, verb={attributes.verb}, "
                                    f"resource=nodes, subresource={attributes.subresource})")
        if not decision.allowed:
            return error_reply(403, forbidden_message(identity, attributes))
        return None

    async def _answer(self, method: str, route: Route, query: Mapping[str, list[str]]) -> Reply:
        endpoint = route.endpoint
        if endpoint == "healthz":
            return healthz_reply(run_health_checks(self._node.health_checks, query), verbose="verbose" in query)
        if endpoint == "pods":
            return Reply(200, self._node.pods_json(), _JSON)
        if endpoint == "stats/summary":
            return Reply(200, orjson.dumps(await self._node.summary()), _JSON)
        if endpoint == "metrics/resource":
            return Reply(200, resource_metrics(await self._node.summary()).encode(), METRICS_CONTENT_TYPE)
        if endpoint == "metrics":
            return Reply(200, self._node.metrics(), METRICS_CONTENT_TYPE)
        if endpoint == "metrics/probes":
            return Reply(200, self._node.probe_metrics(), METRICS_CONTENT_TYPE)
        if endpoint == "metrics/cadvisor":
            return Reply(200, await self._node.cadvisor(), METRICS_CONTENT_TYPE)
        if endpoint == "run":
            if method not in ("POST", "GET"):
                return error_reply(405, "method not allowed")
            options = parse_stream_options("run", query)
            container_id = self._node.find_container(route)
            _, stdout, stderr = await self._node.runtime.exec_sync(container_id, options.command, 0)
            return Reply(200, stdout + stderr, _TEXT)
        return error_reply(404, "page not found")

    # -- long-lived answers --------------------------------------------------------------------

    async def _stream(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      request: h11.Request, method: str, route: Route, query: Mapping[str, list[str]],
                      raw_query: str) -> bool:
        if self._streams.locked():
            await self._send(conn, writer, method, error_reply(503, "too many streams; try again later"))
            return True
        async with self._streams:
            if route.endpoint == "containerLogs":
                return await self._logs(conn, writer, method, route, query)
            if route.endpoint == "logs":
                return await self._node_logs(conn, writer, method, route, query)
            url = await self._streaming_url(route, query)
            # The caller's query goes along, as the kubelet's proxy passes it: the WebSocket
            # port-forward reads its ports from it.
            url = urlsplit(url)._replace(query=raw_query).geturl()
            try:
                await proxy_upgrade(url, method, request.headers.raw_items(), conn.trailing_data[0], reader, writer)
            except StreamingError as err:
                await self._send(conn, writer, method, error_reply(err.status, str(err)), close=True)
            return False  # the connection now belongs to the stream, or is done

    async def _streaming_url(self, route: Route, query: Mapping[str, list[str]]) -> str:
        runtime = self._node.runtime
        if route.endpoint == "portForward":
            return await runtime.port_forward(self._node.find_sandbox(route), parse_ports(query))
        options = parse_stream_options(route.endpoint, query)
        container_id = self._node.find_container(route)
        if route.endpoint == "exec":
            return await runtime.exec(pb.ExecRequest(
                container_id=container_id, cmd=list(options.command), tty=options.tty, stdin=options.stdin,
                stdout=options.stdout, stderr=options.stderr))
        return await runtime.attach(pb.AttachRequest(
            container_id=container_id, stdin=options.stdin, tty=options.tty, stdout=options.stdout,
            stderr=options.stderr))

    async def _logs(self, conn: h11.Connection, writer: asyncio.StreamWriter, method: str, route: Route,
                    query: Mapping[str, list[str]]) -> bool:
        options = parse_log_options(query, now_ns=time.time_ns())
        pod_dir = find_pod_dir(self._node.logs_dir, route.namespace, route.pod, self._node.node_name)
        if not os.path.isdir(os.path.join(pod_dir, route.container)):
            raise NotFoundError(f'container "{route.container}" not found in pod "{route.pod}"')
        try:
            files = container_log_files(pod_dir, route.container, options.previous)
        except LogsError as err:
            raise BadRequest(str(err)) from None  # the kubelet's 400 for a log it cannot give
        pod_uid = pod_dir.rsplit("_", 1)[-1]
        chunks = read_logs(files, options, still_running=lambda: self._node.container_running(pod_uid, route.container),
                           closed=writer.transport.is_closing)
        await self._stream_body(conn, writer, method, chunks)
        return True

    async def _node_logs(self, conn: h11.Connection, writer: asyncio.StreamWriter, method: str, route: Route,
                         query: Mapping[str, list[str]]) -> bool:
        """/logs/: a node log query, or the file or listing its path names; problems are answered before the
        body starts (400, 404)."""
        log_dir = self._node.node_log_dir
        node_query = parse_node_log_query(query)
        if node_query is not None:
            if node_query.files:
                resolve_file(node_query, log_dir)
            chunks = query_chunks(node_query, log_dir, self._node.journal_dir)
        else:
            page, file = await asyncio.to_thread(read_path, log_dir, route.path)
            if page is not None or file is None:  # a directory's listing (read_path gives one or the other)
                await self._send(conn, writer, method, Reply(200, page or b"", "text/html; charset=utf-8"))
                return True
            chunks = file_chunks(file)
        await self._stream_body(conn, writer, method, chunks)
        return True

    async def _stream_body(self, conn: h11.Connection, writer: asyncio.StreamWriter, method: str,
                           chunks: AsyncIterator[bytes]) -> None:
        """A 200 text answer whose body comes in chunks (chunked transfer encoding)."""
        headers = [("content-type", _TEXT), ("x-content-type-options", "nosniff")]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
        if method != "HEAD":
            await self._write_body(conn, writer, chunks)
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _write_body(self, conn: h11.Connection, writer: asyncio.StreamWriter,
                          chunks: AsyncIterator[bytes]) -> None:
        async for chunk in chunks:
            writer.write(conn.send(h11.Data(data=chunk)))
            async with asyncio.timeout(_WRITE_TIMEOUT):
                await writer.drain()
