"""A read-only OCI distribution registry on loopback: the pull side of the `/v2/` API (manifests by tag or
digest, blobs, HEAD, single byte ranges), spoken through h11 on asyncio streams.

It serves whatever a `ContentStore` holds; the air-gap directory uses it so the runtime can pull
archived images through plain CRI PullImage calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

import h11
import orjson

from edgelet.images.archive import Blob
from edgelet.server.http import start_tcp_server

log = logging.getLogger(__name__)

_API_VERSION_HEADER = (b"Docker-Distribution-API-Version", b"registry/2.0")
_ROUTE = re.compile(r"/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<reference>[^/]+)")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_CHUNK = 1024 * 1024
_IDLE_TIMEOUT = 60.0
_MAX_REQUEST_HEAD = 16 * 1024


Opener = Callable[[], BinaryIO]


class ContentStore(Protocol):
    """What the server serves. Lookups are fast, in-memory; bytes are read through the returned opener."""

    def manifest(self, repository: str, reference: str) -> tuple[str, Blob, Opener] | None:
        """(digest, blob, opener) of a manifest by tag or digest in `repository`."""

    def blob(self, repository: str, digest: str) -> tuple[Blob, Opener] | None: ...


@dataclass(slots=True)
class _Reply:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    blob: Blob | None = None
    opener: Opener | None = None
    start: int = 0
    length: int = 0


def _error(status: int, code: str, message: str) -> _Reply:
    body = orjson.dumps({"errors": [{"code": code, "message": message}]})
    return _Reply(status, [(b"Content-Type", b"application/json")], body)


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, length) of a single `bytes=a-b` range, the whole blob when there is none; None if unsatisfiable."""
    if not header:
        return 0, size
    match = _RANGE.fullmatch(header.strip())
    if not match or (not match.group(1) and not match.group(2)):
        return None
    if not match.group(1):  # suffix range: the last N bytes
        length = min(int(match.group(2)), size)
        return size - length, length
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1) - start + 1


def route(store: ContentStore, method: str, target: str, range_header: str | None = None) -> _Reply:
    """The reply to one request (pure apart from the store lookups; bodies of blobs are read later)."""
    if method not in ("GET", "HEAD"):
        reply = _error(405, "UNSUPPORTED", "this registry is read-only")
        reply.headers.append((b"Allow", b"GET, HEAD"))
        return reply
    path = urlsplit(target).path
    if path in ("/v2", "/v2/"):
        return _Reply(200, [(b"Content-Type", b"application/json")], b"{}")
    match = _ROUTE.fullmatch(path)
    if not match:
        return _error(404, "NOT_FOUND", f"no such endpoint {path}")
    repository, reference = unquote(match.group("name")), unquote(match.group("reference"))
    if match.group("kind") == "manifests":
        found = store.manifest(repository, reference)
        if found is None:
            return _error(404, "MANIFEST_UNKNOWN", f"manifest unknown: {repository}:{reference}")
        digest, blob, opener = found
        headers = [(b"Content-Type", blob.media_type.encode()), (b"Docker-Content-Digest", digest.encode())]
        return _Reply(200, headers, blob=blob, opener=opener, length=blob.size)
    if not _DIGEST.fullmatch(reference):
        return _error(400, "DIGEST_INVALID", f"invalid digest {reference!r}")
    found_blob = store.blob(repository, reference)
    if found_blob is None:
        return _error(404, "BLOB_UNKNOWN", f"blob unknown: {reference}")
    blob, opener = found_blob
    span = _byte_range(range_header, blob.size)
    headers = [
        (b"Content-Type", b"application/octet-stream"),
        (b"Docker-Content-Digest", reference.encode()),
        (b"Accept-Ranges", b"bytes"),
    ]
    if span is None:
        reply = _error(416, "RANGE_INVALID", f"range {range_header!r} outside 0-{blob.size - 1}")
        reply.headers.append((b"Content-Range", f"bytes */{blob.size}".encode()))
        return reply
    start, length = span
    status = 200
    if range_header:
        status = 206
        headers.append((b"Content-Range", f"bytes {start}-{start + length - 1}/{blob.size}".encode()))
    return _Reply(status, headers, blob=blob, opener=opener, start=start, length=length)


def _read_span(opener: Opener, blob: Blob, start: int, length: int) -> BinaryIO | bytes:
    if blob.data is not None:
        return blob.data[start : start + length]
    f = opener()
    f.seek(blob.offset + start)
    return f


class RegistryServer:
    """Serves `store` on `host:port` (port 0 picks a free one); `address` is "host:port" once started."""

    def __init__(self, store: ContentStore, *, host: str = "127.0.0.1", port: int = 0):
        self._store = store
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}

    @property
    def address(self) -> str:
        if self._server is None:
            raise RuntimeError("registry server not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def start(self) -> str:
        if self._server is None:
            self._server = await start_tcp_server(self._accept, self._host, self._port)
            log.info("air-gap registry serving on %s", self.address)
        return self.address

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        # Closing the transports ends each handler's read (cancelling them would make asyncio log it).
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None:  # asyncio runs each connection's callback as a task of its own
            raise RuntimeError("a connection handled outside a task")
        self._connections[task] = writer
        try:
            await self._serve(reader, writer)
        except (ConnectionError, TimeoutError, h11.ProtocolError) as err:
            log.debug("air-gap registry: connection ended: %s", err)
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_HEAD)
        while True:
            try:
                request = await self._read_request(conn, reader)
            except h11.RemoteProtocolError:
                await self._refuse_malformed(conn, writer)
                return
            if request is None:
                return
            headers = {name.decode().lower(): value.decode("latin-1") for name, value in request.headers}
            reply = route(self._store, request.method.decode(), request.target.decode("latin-1"), headers.get("range"))
            await self._send(conn, writer, request.method == b"HEAD", reply)
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    async def _refuse_malformed(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        """Answers what is not HTTP with a 400, as Go's server does. containerd >= 1.7 tries HTTPS first even on
        loopback and falls back to plain HTTP only when its TLS hello gets an HTTP answer, not a closed socket."""
        if conn.our_state is not h11.IDLE:
            return
        body = b"400 Bad Request"
        writer.write(conn.send(h11.Response(status_code=400, reason=b"Bad Request", headers=[
            (b"Content-Type", b"text/plain; charset=utf-8"), (b"Connection", b"close"),
            (b"Content-Length", str(len(body)).encode())])))
        writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
        request = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(_IDLE_TIMEOUT):
                    data = await reader.read(64 * 1024)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, head_only: bool, reply: _Reply) -> None:
        source: BinaryIO | bytes | None = None
        if reply.blob is not None and reply.opener is not None and not head_only:
            # Open before the status line goes out, so a vanished file is still a clean 404.
            try:
                source = await asyncio.to_thread(_read_span, reply.opener, reply.blob, reply.start, reply.length)
            except OSError as err:
                reply = _error(404, "BLOB_UNKNOWN", f"content no longer readable: {err.strerror}")
        length = reply.length if reply.blob is not None else len(reply.body)
        headers = [_API_VERSION_HEADER, *reply.headers, (b"Content-Length", str(length).encode())]
        writer.write(conn.send(h11.Response(status_code=reply.status, headers=headers)))
        try:
            if isinstance(source, bytes):
                writer.write(conn.send(h11.Data(data=source)))
            elif source is not None:
                left = reply.length
                while left:
                    chunk = await asyncio.to_thread(source.read, min(left, _CHUNK))
                    if not chunk:
                        raise ConnectionError("blob source ended early")
                    writer.write(conn.send(h11.Data(data=chunk)))
                    await writer.drain()
                    left -= len(chunk)
            elif reply.body and not head_only:
                # (h11 knows a reply to HEAD carries no body, whatever its Content-Length says.)
                writer.write(conn.send(h11.Data(data=reply.body)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        finally:
            if source is not None and not isinstance(source, bytes):
                source.close()
