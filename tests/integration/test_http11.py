"""edgelet.util.http11 held to httpx, the library it replaces: the same scripted server bytes on loopback give both
clients the same status, headers and body (Content-Length, chunked, close-delimited, 1xx first, no body, a
streamed watch), both refuse what is not HTTP, both reuse a kept-alive connection, and both send the same
request line and query for the API paths the agent uses."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import httpx
import pytest

from edgelet.util.http11 import HttpError, Pool, target
from tests.kubeapi_double.testcerts import TEST_CERT, TEST_KEY


class ScriptedServer:
    """Answers each request read on a connection with the next scripted response bytes; records requests."""

    def __init__(self, responses: list[bytes], *, close_after_each: bool = False, tls: ssl.SSLContext | None = None):
        self.responses = responses
        self.close_after_each = close_after_each
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self._next = 0

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    def reset(self) -> None:
        self._next, self.requests, self.connections = 0, [], 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self._next < len(self.responses):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + (await reader.readexactly(length) if length else b""))
                response = self.responses[self._next]
                self._next += 1
                for piece in response.split(b"<pause>"):  # a streamed body arrives in parts
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if self.close_after_each or b"Connection: close" in response:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def with_httpx(server: ScriptedServer, method: str = "GET", path: str = "/x", body: bytes = b"",
                     scheme: str = "http") -> tuple[int, list[tuple[str, str]], bytes]:
    async with httpx.AsyncClient(verify=False, trust_env=False) as client:
        response = await client.request(method, f"{scheme}://127.0.0.1:{server.port}{path}", content=body or None)
        return response.status_code, [(k.decode().lower(), v.decode()) for k,
                                      v in response.headers.raw], response.content


async def with_http11(server: ScriptedServer, method: str = "GET", path: str = "/x", body: bytes = b"",
                      scheme: str = "http") -> tuple[int, list[tuple[str, str]], bytes]:
    tls = None
    if scheme == "https":
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    pool = Pool(f"{scheme}://127.0.0.1:{server.port}", tls=tls)
    try:
        response = await pool.request(method, path, body=body, timeout=5)
        return response.status, list(response.headers), response.body
    finally:
        await pool.aclose()


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n" \
          b"5\r\n{\"a\":<pause>\r\n3\r\n 1}\r\n0\r\n\r\n"
RESPONSES = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\nhello",
    "chunked": CHUNKED,
    "close-delimited": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil<pause> the end",
    "informational first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
    "no content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "error status": b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
    "redirect not followed": b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("case", sorted(RESPONSES))
async def test_same_answer_as_httpx(case, scheme, tmp_path):
    tls = None
    if scheme == "https":
        (tmp_path / "c.pem").write_text(TEST_CERT)
        (tmp_path / "k.pem").write_text(TEST_KEY)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    async with ScriptedServer([RESPONSES[case]], close_after_each=True, tls=tls) as server:
        expected = await with_httpx(server, scheme=scheme)
        server.reset()
        assert await with_http11(server, scheme=scheme) == expected


@pytest.mark.parametrize("garbage",
                         [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                                     b"HTTP/1.1 abc\r\n\r\n", b""])
async def test_both_refuse_what_is_not_http(garbage):
    async with ScriptedServer([garbage], close_after_each=True) as server:
        with pytest.raises(httpx.HTTPError):
            await with_httpx(server)
        server.reset()
        with pytest.raises(HttpError):
            await with_http11(server)


@pytest.mark.parametrize(("answer", "message"), [
    (b"", "the server closed the connection without an answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "the server closed the connection inside the body"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "the server closed the connection without an answer"),
])
async def test_a_connection_closed_early_is_named_so(answer, message):
    # Not "the server's answer is not HTTP/1.1: can't handle event type ConnectionClosed ...", which h11 says.
    async with ScriptedServer([answer], close_after_each=True) as server:
        with pytest.raises(HttpError, match=f"^{message}$"):
            await with_http11(server)


async def test_a_kept_alive_connection_serves_the_next_request():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with ScriptedServer([ok, ok, ok]) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}")
        try:
            for _ in range(3):
                assert (await pool.request("GET", "/x", timeout=5)).body == b"ok"
        finally:
            await pool.aclose()
        assert server.connections == 1


async def test_a_streamed_body_arrives_in_order_as_httpx_reads_it():
    events = b"".join(b'{"type":"ADDED","object":{"n":%d}}\n<pause>' % i for i in range(5))
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in events.split(b"<pause>") if part) + b"0\r\n\r\n"
    async with ScriptedServer([stream], close_after_each=True) as server:
        async with httpx.AsyncClient() as client, client.stream("GET", f"http://127.0.0.1:{server.port}/w") as response:
            expected = b"".join([chunk async for chunk in response.aiter_raw()])
        server.reset()
        pool = Pool(f"http://127.0.0.1:{server.port}")
        async with pool.stream("GET", "/w", timeout=5) as streamed:
            got = b"".join([chunk async for chunk in streamed.chunks])
        await pool.aclose()
    assert got == expected == events.replace(b"<pause>", b"")


def agent_queries() -> Iterator[dict[str, str]]:
    yield {"fieldSelector": "spec.nodeName=edge-1", "resourceVersion": "12", "allowWatchBookmarks": "true",
           "watch": "true", "timeoutSeconds": "300"}
    yield {"labelSelector": "app!=x,tier in (a,b)"}
    yield {"fieldSelector": "metadata.name=kube-root-ca.crt"}


@pytest.mark.parametrize("params", list(agent_queries()))
async def test_the_request_line_is_httpx_s(params):
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    async with ScriptedServer([ok], close_after_each=True) as server:
        async with httpx.AsyncClient() as client:
            await client.post(f"http://127.0.0.1:{server.port}/api/v1/pods", params=params, content=b'{"a":1}')
        [from_httpx] = server.requests
        server.reset()
        pool = Pool(f"http://127.0.0.1:{server.port}")
        await pool.request("POST", target("/api/v1/pods", params), body=b'{"a":1}', timeout=5)
        await pool.aclose()
        [ours] = server.requests
    assert ours.split(b"\r\n")[0] == from_httpx.split(b"\r\n")[0]
    assert ours.partition(b"\r\n\r\n")[2] == from_httpx.partition(b"\r\n\r\n")[2] == b'{"a":1}'

    def header(request: bytes, name: bytes) -> bytes:
        return next(line for line in request.split(b"\r\n") if line.lower().startswith(name + b":"))

    assert header(ours, b"host") == header(from_httpx, b"host")
    assert header(ours, b"content-length").lower() == header(from_httpx, b"content-length").lower()
