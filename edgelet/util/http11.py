"""A small HTTP/1.1 client on h11 for the agent's own requests: the API server (a keep-alive pool per server,
streamed watch bodies) and probe and hook GETs (one connection each). It does that one job, in place of httpx
with httpcore and anyio (about 3 MiB of the agent); tests/integration/test_http11.py holds it to httpx.

No proxies, no redirects (callers that follow them do so themselves), no compression, no HTTP/2.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import h11

_READ_SIZE = 64 * 1024
Headers = Iterable[tuple[str, str]]


class HttpError(Exception):
    """The request got no complete answer: connect refused or failed, TLS failed, the connection broke, or
    the server did not speak HTTP/1.1."""


class HttpTimeout(HttpError):
    """Connect or a read took longer than its timeout."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go: scheme (http or https), host and port of a URL."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"not an http(s) URL: {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise HttpError(f"invalid port in {url!r}") from None
        return cls(parts.scheme, parts.hostname, port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def target(path: str, params: Mapping[str, str] | None = None) -> str:
    """The request target: `path`, then the query of `params` (in their order) after the path's own."""
    if not params:
        return path
    return f"{path}{'&' if '?' in path else '?'}{urlencode(list(params.items()))}"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for key, value in self.headers if key == lowered), None)


class Connection:
    """One TCP (or TLS) connection speaking HTTP/1.1 through an h11 state machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()

    @classmethod
    async def open(cls, origin: Origin, tls: ssl.SSLContext | None, timeout: float | None) -> Connection:
        context = tls if origin.scheme == "https" else None
        if origin.scheme == "https" and context is None:
            context = ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    origin.host, origin.port, ssl=context, limit=_READ_SIZE,
                    server_hostname=origin.host if context is not None else None)
        except TimeoutError:
            raise HttpTimeout(f"connect to {origin.host_header} timed out after {timeout:g}s") from None
        except (OSError, ssl.SSLError) as exc:
            raise HttpError(f"connect to {origin.host_header}: {exc}") from None
        return cls(reader, writer)

    async def send(self, method: str, request_target: str, headers: Headers, body: bytes) -> None:
        events: list[h11.Request | h11.Data | h11.EndOfMessage] = [
            h11.Request(method=method, target=request_target, headers=list(headers))]
        if body:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        try:
            self._writer.write(b"".join(self._h11.send(event) or b"" for event in events))
            await self._writer.drain()
        except h11.LocalProtocolError as exc:
            raise HttpError(f"cannot send the request: {exc}") from None
        except (OSError, ssl.SSLError) as exc:
            raise HttpError(f"the connection broke while sending: {exc}") from None

    async def _next_event(self, timeout: float | None) -> object:
        while True:
            state = self._h11.their_state  # h11 turns it to ERROR when it raises
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                if self._reader.at_eof():  # h11 refuses an end of stream where its state wants more
                    where = "without an answer" if state is h11.SEND_RESPONSE else "inside the body"
                    raise HttpError(f"the server closed the connection {where}") from None
                raise HttpError(f"the server's answer is not HTTP/1.1: {exc}") from None
            if event is not h11.NEED_DATA:
                return event
            try:
                async with asyncio.timeout(timeout):
                    data = await self._reader.read(_READ_SIZE)
            except TimeoutError:
                raise HttpTimeout(f"no data from the server within {timeout:g}s") from None
            except (OSError, ssl.SSLError) as exc:
                raise HttpError(f"the connection broke: {exc}") from None
            self._h11.receive_data(data)

    async def response_head(self, timeout: float | None) -> h11.Response:
        while True:
            event = await self._next_event(timeout)
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise HttpError("the server closed the connection without an answer")
            # h11.InformationalResponse (1xx) is skipped, as httpx does

    async def body(self, timeout: float | None) -> AsyncIterator[bytes]:
        while True:
            event = await self._next_event(timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("the server closed the connection inside the body")

    def reusable(self) -> bool:
        """Both sides finished the exchange and neither asked to close: ready for the next request."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            self.idle_since = time.monotonic()
            return not self._reader.at_eof()
        return False

    def alive(self) -> bool:
        """Not closed by either side while it sat idle. An idle connection has nothing to read: a readable
        socket holds the server's EOF (or stray bytes), which the loop may not have delivered yet."""
        if self._reader.at_eof() or self._writer.transport.is_closing():
            return False
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        self._writer.close()


def _head_of(event: h11.Response) -> tuple[int, tuple[tuple[str, str], ...]]:
    headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers)
    return event.status_code, headers


class StreamedResponse:
    def __init__(self, status: int, headers: tuple[tuple[str, str], ...], chunks: AsyncIterator[bytes]):
        self.status, self.headers, self.chunks = status, headers, chunks

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks])


class Pool:
    """Keep-alive connections to one origin: at most `max_connections` at once (more requests wait for one),
    at most `max_idle` kept between requests, each for `keepalive_expiry` seconds."""

    def __init__(self, base_url: str, *, tls: ssl.SSLContext | None = None, headers: Headers = (),
                 connect_timeout: float = 5.0, max_connections: int = 10, max_idle: int = 5,
                 keepalive_expiry: float = 60.0):
        self.origin = Origin.of(base_url)
        self._tls = tls
        self._headers = [("Host", self.origin.host_header), *headers]
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._expiry = keepalive_expiry
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._slots = asyncio.Semaphore(max_connections)
        self.is_closed = False

    async def _connection(self) -> Connection:
        while self._idle:
            connection = self._idle.pop()
            if time.monotonic() - connection.idle_since < self._expiry and connection.alive():
                return connection
            self._drop(connection)
        connection = await Connection.open(self.origin, self._tls, self._connect_timeout)
        self._open.add(connection)
        return connection

    def _release(self, connection: Connection) -> None:
        if connection.reusable() and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        self._open.discard(connection)
        connection.close()

    @contextlib.asynccontextmanager
    async def stream(self, method: str, request_target: str, *, headers: Headers = (), body: bytes = b"",
                     timeout: float | None = None) -> AsyncIterator[StreamedResponse]:
        """The response with its body still to read (`chunks`); every read waits at most `timeout` seconds."""
        if self.is_closed:
            raise HttpError(f"the pool to {self.origin.host_header} is closed")
        async with self._slots:
            async with self._exchange(method, request_target, headers, body, timeout) as response:
                yield response

    @contextlib.asynccontextmanager
    async def _exchange(self, method: str, request_target: str, headers: Headers, body: bytes,
                        timeout: float | None) -> AsyncIterator[StreamedResponse]:
        connection = await self._connection()
        finished = False
        try:
            all_headers = [*self._headers, *headers]
            if body:
                all_headers.append(("Content-Length", str(len(body))))
            await connection.send(method, request_target, all_headers, body)
            status, response_headers = _head_of(await connection.response_head(timeout))
            yield StreamedResponse(status, response_headers, connection.body(timeout))
            finished = True
        finally:
            if finished:
                self._release(connection)
            else:
                self._drop(connection)

    async def request(self, method: str, request_target: str, *, headers: Headers = (), body: bytes = b"",
                      timeout: float | None = None) -> Response:
        async with self.stream(method, request_target, headers=headers, body=body, timeout=timeout) as response:
            return Response(response.status, response.headers, await response.read())

    async def aclose(self) -> None:
        """Closes every connection; a stream still running on one ends with HttpError."""
        self.is_closed = True
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()
