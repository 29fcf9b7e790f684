"""The upgrade proxy over real loopback sockets, against a small streaming server written here: what is
forwarded, the 101 relayed, both directions spliced, the caller's half-close passed on, errors relayed.
(Against containerd's own streaming server: test_kubelet_api.py and the e2e suite.)"""

from __future__ import annotations

import asyncio

import pytest

from edgelet.kubeletapi.streaming import StreamingError, proxy_upgrade


class Backend:
    """Answers 101 and echoes until the caller's end of input, then says bye; or answers `refuse`."""

    def __init__(self, refuse: bytes = b"") -> None:
        self.refuse = refuse
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Backend:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        if self.refuse:
            writer.write(self.refuse)
        else:
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
            while data := await reader.read(65536):
                writer.write(data)
            writer.write(b"bye")
        await writer.drain()
        writer.close()


async def proxied(backend: Backend, request_headers, early: bytes, send: bytes) -> bytes:
    """Everything a caller receives through a proxy in front of `backend`, after sending `send` and EOF."""
    async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await proxy_upgrade(f"http://127.0.0.1:{backend.port}/exec/token?ignored=1", "POST", request_headers,
                                early, reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(front, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(send)
        writer.write_eof()
        received = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return received
    finally:
        server.close()
        await server.wait_closed()


HEADERS = [(b"Host", b"node:10250"), (b"Authorization", b"Bearer secret"), (b"Connection", b"Upgrade"),
           (b"Upgrade", b"SPDY/3.1"), (b"X-Stream-Protocol-Version", b"v4.channel.k8s.io"),
           (b"X-Stream-Protocol-Version", b"v3.channel.k8s.io")]


async def test_upgrade_is_relayed_and_spliced_both_ways():
    async with Backend() as backend:
        received = await proxied(backend, HEADERS, b"early ", b"late")
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    assert body == b"early latebye"  # echoed, the caller's EOF passed on, the backend's last words relayed
    forwarded = backend.heads[0]
    assert forwarded.startswith(b"POST /exec/token?ignored=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{backend.port}".encode() in forwarded
    assert b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io" \
        in forwarded
    assert b"secret" not in forwarded and b"node:10250" not in forwarded


async def test_a_refusal_is_relayed_with_its_body():
    refusal = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request"
    async with Backend(refuse=refusal) as backend:
        received = await proxied(backend, HEADERS, b"", b"")
    assert received == refusal


async def test_unreachable_or_non_loopback_streaming_servers_are_errors():
    reader = asyncio.StreamReader()
    with pytest.raises(StreamingError) as refused:
        await proxy_upgrade("http://192.0.2.1:1/exec/t", "GET", [], b"", reader, None)  # type: ignore[arg-type]
    assert refused.value.status == 500 and "loopback" in str(refused.value)
    async with Backend() as backend:
        port = backend.port
    with pytest.raises(StreamingError) as unreachable:
        await proxy_upgrade(f"http://127.0.0.1:{port}/exec/t", "GET", [], b"", reader, None)  # type: ignore[arg-type]
    assert unreachable.value.status == 502
