"""exec, attach and port-forward: the caller's HTTP Upgrade request is passed to the runtime's streaming
server at the URL CRI gave, its answer relayed, and after a 101 the two connections spliced byte for byte.

Splicing the upgraded connection serves every protocol the runtime speaks (SPDY/3.1 and WebSocket,
`v4.channel.k8s.io` and its family) without this agent parsing a single frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
MAX_RESPONSE_HEAD = 64 * 1024
# What the runtime needs to choose and complete the upgrade; everything else (credentials, Impersonate-*,
# cookies, this hop's framing) stays with the kubelet API.
_FORWARDED = frozenset({b"upgrade", b"connection", b"x-stream-protocol-version"})
_FORWARDED_PREFIX = b"sec-websocket-"


def forwarded(name: bytes) -> bool:
    """Whether a request header of the caller is passed on to the streaming server."""
    lowered = name.lower()
    return lowered in _FORWARDED or lowered.startswith(_FORWARDED_PREFIX)


class StreamingError(Exception):
    """The streaming server could not be reached or answered badly; `status` is what the caller gets."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def loopback_target(url: str) -> tuple[str, int, str]:
    """(host, port, path?query) of a streaming URL; only plain HTTP on a loopback address is accepted."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise StreamingError(500, f"the runtime's streaming URL {url!r} is not http://HOST:PORT/...")
    try:
        loopback = ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if not loopback:
        raise StreamingError(500, f"the runtime's streaming server {parts.netloc} is not on loopback; "
                                  "configure it to listen on 127.0.0.1")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port, target


def request_head(method: str, target: str, netloc: str, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The request to the streaming server: the caller's Upgrade, Connection, Sec-WebSocket-* and
    X-Stream-Protocol-Version headers (every repeat kept), its own Host, no credentials."""
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: " + netloc.encode()]
    lines += [name + b": " + value for name, value in headers if forwarded(name)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def response_status(head: bytes) -> int:
    """The status code of a response head; StreamingError when it is not HTTP."""
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
        raise StreamingError(502, "the runtime's streaming server did not answer in HTTP")
    return int(status_line[1])


async def proxy_upgrade(
    url: str, method: str, headers: Iterable[tuple[bytes, bytes]], early_data: bytes,
    client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, *, connect_timeout: float = 10.0,
) -> int:
    """Relays one upgrade; returns the streaming server's status (101 once the session has ended).

    StreamingError before anything was written to the caller; afterwards failures just end the session.
    """
    host, port, target = loopback_target(url)
    headers = list(headers)
    try:
        async with asyncio.timeout(connect_timeout):
            backend_reader, backend_writer = await asyncio.open_connection(host, port, limit=MAX_RESPONSE_HEAD)
    except (OSError, TimeoutError) as err:
        raise StreamingError(502, f"cannot reach the runtime's streaming server at {host}:{port}: {err}") from None
    try:
        backend_writer.write(request_head(method, target, f"{host}:{port}", headers) + early_data)
        try:
            async with asyncio.timeout(connect_timeout):
                head = await backend_reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError) as err:
            raise StreamingError(502, f"the runtime's streaming server gave no usable answer: {err!r}") from None
        status = response_status(head)
        log.debug("streaming %s %s: %d, upgrade %s", method, target.split("?")[0].rsplit("/", 1)[0], status,
                  next((v.decode("latin-1") for k, v in headers if k.lower() == b"upgrade"), "none"))
        client_writer.write(head)
        await client_writer.drain()
        if status == 101:
            await splice(client_reader, client_writer, backend_reader, backend_writer)
        else:
            # An error from the runtime (e.g. an unsupported protocol): its body follows, then it closes.
            await _pipe(backend_reader, client_writer, half_close=False)
        return status
    finally:
        backend_writer.close()
        with contextlib.suppress(Exception):
            await backend_writer.wait_closed()


async def splice(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 backend_reader: asyncio.StreamReader, backend_writer: asyncio.StreamWriter) -> None:
    """Copies both ways; the caller's end of input is passed on as a half-close, the session ends
    when the runtime's side ends (it sends the exit status last)."""
    upstream = asyncio.ensure_future(_pipe(client_reader, backend_writer, half_close=True))
    try:
        await _pipe(backend_reader, client_writer, half_close=False)
    finally:
        upstream.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await upstream


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, half_close: bool) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if half_close and writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
