"""The ops endpoint: /healthz, /metrics and /pods over HTTP/1.1 on loopback or a unix socket, spoken
through h11 on plain asyncio streams so it costs almost no memory; its HttpServer also carries the kubelet API."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import h11

from edgelet.metrics.registry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgelet.metrics.registry import Registry
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, str]]

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_ALLOWED_METHODS = ("GET", "HEAD")
_READ_CHUNK = 64 * 1024
# After an error reply, how long input is drained before closing: closing a socket with unread
# input makes the kernel send a reset, which can destroy the reply before the client reads it.
_LINGER_SECONDS = 0.5


# --- addresses ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where to listen: a TCP host and port, or a unix socket path (host and port unused)."""

    host: str = ""
    port: int = 0
    unix_path: str = ""

    def __str__(self) -> str:
        if self.unix_path:
            return f"unix:{self.unix_path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(address: str) -> ListenAddress:
    """Reads "127.0.0.1:10248", "[::1]:10248" or "unix:/run/edgelet.sock"; ValueError names what is wrong."""
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        path = "/" + path.lstrip("/") if path.startswith("//") else path
        if not path.startswith("/"):
            raise ValueError(f"server address {address!r}: the unix socket path must be absolute")
        return ListenAddress(unix_path=path)
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"server address {address!r}: expected HOST:PORT, [IPV6]:PORT or unix:/PATH")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"server address {address!r}: put an IPv6 address in brackets, like [::1]:10248")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"server address {address!r}: port must be a number from 0 to 65535")
    return ListenAddress(host=host, port=int(port))


# --- binding every listener before the agent starts --------------------------------------------


class ListenError(EdgeletError):
    """A listener cannot bind its address: the agent must not run without it."""


class Listener(Protocol):
    """What the agent binds before anything else starts (the ops endpoint, the kubelet API)."""

    address: ListenAddress

    async def start(self) -> None: ...  # binds; raises ListenError naming the address

    async def close(self) -> None: ...

    async def run(self) -> None: ...  # serves until cancelled (binds first when start() was not called)


async def start_tcp_server(client_connected: Callable, host: str, port: int, **options: Any) -> asyncio.Server:
    """asyncio.start_server on host:port ("" is every interface), binding an IP address itself.

    uvloop encodes every host it binds with the idna codec, whose import (stringprep, unicodedata) costs
    the agent about 300 KiB for its whole life; a socket bound here spares that for "127.0.0.1".
    """
    if (sock := bound_ip_socket(host, port)) is not None:
        return await asyncio.start_server(client_connected, sock=sock, **options)
    return await asyncio.start_server(client_connected, host or None, port, reuse_address=True, **options)


def bound_ip_socket(host: str, port: int) -> socket.socket | None:
    """A TCP socket bound with the options asyncio's create_server sets, when `host` is an IP address; else None."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def bind_all(listeners: list[Listener]) -> None:
    """Binds every listener or none: on the first failure the ones bound are closed and the ListenError raised."""
    bound: list[Listener] = []
    try:
        for listener in listeners:
            await listener.start()
            bound.append(listener)
    except BaseException:
        for listener in reversed(bound):
            await listener.close()
        raise


def bind_error(address: ListenAddress, exc: OSError) -> ListenError:
    """One line naming the address and the reason, without asyncio's repetition of the socket tuple."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return ListenError(f"cannot listen on {address}: {reason}")


# --- routing and responses (pure) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = _TEXT
    extra_headers: tuple[tuple[str, str], ...] = ()


def healthz_reply(results: Mapping[str, tuple[bool, str]], *, verbose: bool) -> Reply:
    """The kubelet's /healthz: "ok", or 500 with a `[-]name failed: reason` line per failing check."""
    failing = [name for name, (ok, _) in results.items() if not ok]
    if not failing and not verbose:
        return Reply(200, b"ok")
    lines = []
    for name, (ok, reason) in results.items():
        if ok and verbose:
            lines.append(f"[+]{name} ok")
        elif not ok:
            lines.append(f"[-]{name} failed: {reason or 'reason not given'}")
    lines.append("healthz check failed" if failing else "healthz check passed")
    return Reply(500 if failing else 200, ("\n".join(lines) + "\n").encode())


def error_reply(status: int, message: str, *extra_headers: tuple[str, str]) -> Reply:
    return Reply(status, f"{status} {message}\n".encode(), _TEXT, extra_headers)


# --- the server -----------------------------------------------------------------------------------


class HttpServer:
    """HTTP/1.1 over h11 on asyncio streams (optionally TLS): limits, timeouts and error replies.

    Subclasses answer requests in `respond`; a misbehaving client only ever costs its own connection.
    """

    name = "http server"

    def __init__(
        self,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        request_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        max_header_bytes: int = 16 * 1024,
        max_body_bytes: int = 64 * 1024,
        max_connections: int = 64,
    ) -> None:
        self.address = parse_address(address)
        self._ssl = ssl_context
        self._request_timeout = request_timeout
        self._idle_timeout = idle_timeout
        self._max_header_bytes = max_header_bytes
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def bound_addresses(self) -> list[ListenAddress]:
        """The addresses actually listened on: tells a caller which port ":0" picked."""
        if self._server is None:
            return []
        if self.address.unix_path:
            return [self.address]
        return [ListenAddress(host=s.getsockname()[0], port=s.getsockname()[1]) for s in self._server.sockets]

    async def start(self) -> None:
        """Binds the address; ListenError names it when that is impossible (in use, no permission)."""
        try:
            if self.address.unix_path:
                _remove_stale_socket(self.address.unix_path)
                self._server = await asyncio.start_unix_server(self._accept, self.address.unix_path, ssl=self._ssl)
                # The endpoint lists every pod on the node: only root (and its group) may read it.
                os.chmod(self.address.unix_path, 0o660)
            else:
                self._server = await start_tcp_server(
                    self._accept, self.address.host, self.address.port, ssl=self._ssl,
                    ssl_handshake_timeout=self._request_timeout if self._ssl else None,
                )
        except OSError as exc:
            raise bind_error(self.address, exc) from None
        log.info("%s listening on %s", self.name, ", ".join(map(str, self.bound_addresses)))

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
        if self.address.unix_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address.unix_path)

    async def run(self) -> None:
        """Serves until cancelled, then closes."""
        if self._server is None:
            await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def respond(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: h11.Request
    ) -> bool:
        """Answers one request; False when the connection must not carry another one."""
        raise NotImplementedError

    # --- per connection ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None:  # asyncio runs each connection's callback as a task of its own
            raise RuntimeError("a connection handled outside a task")
        self._connections.add(task)
        try:
            if len(self._connections) > self._max_connections:
                conn = h11.Connection(h11.SERVER)
                await self._reject(conn, reader, writer, error_reply(503, "too many connections"))
            else:
                await self._serve(reader, writer)
        except (ConnectionError, TimeoutError, h11.LocalProtocolError, ssl.SSLError) as err:
            log.debug("%s connection ended: %r", self.name, err)
        except asyncio.CancelledError:
            pass  # close() is ending it; a cancelled callback task makes Python 3.11's streams log an error
        except Exception:
            log.exception("%s connection failed", self.name)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_header_bytes)
        while True:
            try:
                request = await self._read_request(conn, reader)
            except h11.RemoteProtocolError as err:
                status = err.error_status_hint
                message = "request header fields too large" if status == 431 else f"bad request: {err}"
                await self._reject(conn, reader, writer, error_reply(status, message))
                return
            except _BodyTooLarge:
                await self._reject(conn, reader, writer, error_reply(413, "request body too large"))
                return
            except TimeoutError:
                # An idle keep-alive connection just goes; one stuck mid-request learns why.
                if conn.their_state is not h11.IDLE or conn.trailing_data[0]:
                    await self._reject(conn, reader, writer, error_reply(408, "request timeout"))
                return
            if request is None:
                return
            if not await self.respond(conn, reader, writer, request) or conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
        """The next complete request (its body read and dropped), or None once the client has gone.

        The idle timeout covers the wait for a request's first byte; from then on the whole request
        must arrive within request_timeout, so a client trickling bytes cannot hold the connection.
        """
        loop = asyncio.get_running_loop()
        request: h11.Request | None = None
        body_bytes = 0
        receiving = False
        async with asyncio.timeout(self._idle_timeout) as deadline:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if not receiving and (request is not None or conn.trailing_data[0]):
                        receiving = True
                        deadline.reschedule(loop.time() + self._request_timeout)
                    conn.receive_data(await reader.read(_READ_CHUNK))
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body_bytes += len(event.data)
                    if body_bytes > self._max_body_bytes:
                        raise _BodyTooLarge
                elif isinstance(event, h11.EndOfMessage):
                    return request
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return None

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, method: str, reply: Reply, *, close: bool = False
    ) -> None:
        headers = [
            ("content-type", reply.content_type),
            ("content-length", str(len(reply.body))),
            ("x-content-type-options", "nosniff"),
            *reply.extra_headers,
        ]
        if close:
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=reply.status, headers=headers))
        if method != "HEAD":
            data += conn.send(h11.Data(data=reply.body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        # A client that stops reading must not pin the response in memory forever.
        async with asyncio.timeout(self._request_timeout):
            await writer.drain()

    async def _reject(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> None:
        """Sends an error reply on a connection that cannot go on, then closes it without a reset."""
        await self._send(conn, writer, "GET", reply, close=True)
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
            async with asyncio.timeout(_LINGER_SECONDS):
                while await reader.read(_READ_CHUNK):
                    pass


class OpsServer(HttpServer):
    """The ops routes: /healthz (and /healthz/<check>), /metrics, /pods."""

    name = "ops endpoint"

    def __init__(
        self,
        address: str,
        *,
        health_checks: Mapping[str, HealthCheck],
        pods_json: Callable[[], bytes],
        registry: Registry,
        **limits: Any,
    ) -> None:
        super().__init__(address, **limits)
        self._health_checks = dict(health_checks)
        self._pods_json = pods_json
        self._registry = registry

    async def respond(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: h11.Request
    ) -> bool:
        method = request.method.decode("ascii", "replace")
        await self._send(conn, writer, method, self._dispatch(method, request.target))
        return True

    def _dispatch(self, method: str, target: bytes) -> Reply:
        url = urlsplit(target.decode("ascii", "replace"))
        handler = self._route(url.path, parse_qs(url.query, keep_blank_values=True))
        if handler is None:
            return error_reply(404, "page not found")
        if method not in _ALLOWED_METHODS:
            return error_reply(405, "method not allowed", ("allow", ", ".join(_ALLOWED_METHODS)))
        try:
            return handler()
        except Exception as err:
            log.exception("ops endpoint %s failed", url.path)
            return error_reply(500, f"internal server error: {err}")

    def _route(self, path: str, query: Mapping[str, list[str]]) -> Callable[[], Reply] | None:
        if path == "/metrics":
            return self._metrics
        if path == "/pods":
            return self._pods
        if path == "/healthz":
            return partial(self._healthz, query)
        check = path.removeprefix("/healthz/")
        if check != path and check in self._health_checks:
            return partial(self._healthz_one, check, "verbose" in query)
        return None

    def _healthz(self, query: Mapping[str, list[str]]) -> Reply:
        return healthz_reply(run_health_checks(self._health_checks, query), verbose="verbose" in query)

    def _healthz_one(self, check: str, verbose: bool = False) -> Reply:
        """`/healthz/<check>`: "ok", or with `?verbose` what the check saw ("ok: 2/2 konnectivity streams ...")."""
        ok, reason = _run_check(self._health_checks[check])
        if ok:
            return Reply(200, f"ok: {reason}\n".encode()) if verbose and reason else Reply(200, b"ok")
        return error_reply(500, f"internal server error: {reason}")

    def _metrics(self) -> Reply:
        return Reply(200, self._registry.exposition(), METRICS_CONTENT_TYPE)

    def _pods(self) -> Reply:
        return Reply(200, self._pods_json(), _JSON)


def run_health_checks(checks: Mapping[str, HealthCheck], query: Mapping[str, list[str]]) -> dict[str, tuple[bool, str]]:
    """Runs every check not named in `?exclude=a,b`."""
    excluded = {name for value in query.get("exclude", []) for name in value.split(",")}
    return {name: _run_check(fn) for name, fn in checks.items() if name not in excluded}


class _BodyTooLarge(Exception):
    pass


def _run_check(check: HealthCheck) -> tuple[bool, str]:
    try:
        return check()
    except Exception as err:
        log.exception("health check failed to run")
        return False, f"check raised {type(err).__name__}: {err}"


def _remove_stale_socket(path: str) -> None:
    """A socket left by a crashed run would make bind fail; anything else at the path is not ours."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"unix:{path} exists and is not a socket")
    os.unlink(path)
