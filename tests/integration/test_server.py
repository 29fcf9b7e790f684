"""The ops endpoint over real sockets on 127.0.0.1 and a unix socket: routes, HTTP edge cases, hostile clients."""

import asyncio
import json
import os
import socket
import stat

import httpx
import pytest
import uvloop

from edgelet.metrics.registry import Counter, Registry
from edgelet.server.http import (
    ListenAddress,
    ListenError,
    OpsServer,
    bind_all,
    bound_ip_socket,
    healthz_reply,
    parse_address,
)

PODS = {"kind": "PodList", "apiVersion": "v1", "items": [{"metadata": {"name": "web", "namespace": "default"}}]}


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:10248", ListenAddress(host="127.0.0.1", port=10248)),
        ("[::1]:10248", ListenAddress(host="::1", port=10248)),
        ("localhost:0", ListenAddress(host="localhost", port=0)),
        ("unix:/run/edgelet/ops.sock", ListenAddress(unix_path="/run/edgelet/ops.sock")),
        ("unix:///run/edgelet/ops.sock", ListenAddress(unix_path="/run/edgelet/ops.sock")),
    ],
)
def test_parse_address(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "complaint"),
    [
        ("10248", "expected HOST:PORT"),
        (":10248", "expected HOST:PORT"),
        ("::1:10248", "brackets"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:70000", "port must be a number"),
        ("unix:ops.sock", "must be absolute"),
    ],
)
def test_parse_address_rejects(address, complaint):
    with pytest.raises(ValueError, match=complaint) as err:
        parse_address(address)
    assert address in str(err.value)


@pytest.mark.parametrize(
    ("results", "verbose", "status", "body"),
    [
        ({"pleg": (True, "")}, False, 200, "ok"),
        ({"pleg": (True, "")}, True, 200, "[+]pleg ok\nhealthz check passed\n"),
        (
            {"syncloop": (True, ""), "pleg": (False, "PLEG is not healthy: pleg was last seen active 3m5s ago")},
            False,
            500,
            "[-]pleg failed: PLEG is not healthy: pleg was last seen active 3m5s ago\nhealthz check failed\n",
        ),
        (
            {"syncloop": (True, ""), "pleg": (False, "")},
            True,
            500,
            "[+]syncloop ok\n[-]pleg failed: reason not given\nhealthz check failed\n",
        ),
    ],
)
def test_healthz_reply(results, verbose, status, body):
    reply = healthz_reply(results, verbose=verbose)
    assert (reply.status, reply.body.decode()) == (status, body)


class Node:
    """What the endpoint reports on; tests flip it to see the responses change."""

    def __init__(self):
        self.pleg = (True, "")
        self.pods = json.dumps(PODS).encode()
        self.registry = Registry()
        self.syncs = Counter("edgelet_test_syncs", "Syncs done by the test.", registry=self.registry)

    def pods_json(self):
        if isinstance(self.pods, Exception):
            raise self.pods
        return self.pods

    def checks(self):
        return {"pleg": lambda: self.pleg, "syncloop": lambda: (True, "")}


@pytest.fixture
def node():
    return Node()


@pytest.fixture
async def serve(node):
    """Starts servers with the given options on an ephemeral port; yields a factory, closes all at the end."""
    servers = []

    async def start(address="127.0.0.1:0", **options):
        server = OpsServer(
            address, health_checks=node.checks(), pods_json=node.pods_json, registry=node.registry, **options
        )
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def server(serve):
    return await serve()


def base_url(server):
    bound = server.bound_addresses[0]
    return f"http://{bound}"


async def connect(server):
    bound = server.bound_addresses[0]
    return await asyncio.open_connection(bound.host, bound.port)


async def read_response(reader, *, head=False):
    """(status, headers, body) of one response; reads no body after a HEAD, as HTTP requires."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *header_lines = raw.decode("latin-1").split("\r\n")[:-2]
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return int(status_line.split()[1]), headers, body


async def read_to_eof(reader):
    return await asyncio.wait_for(reader.read(), 10)


def get(path, *extra):
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *extra]) + "\r\n\r\n").encode()


# --- routes ---------------------------------------------------------------------------------------


async def test_healthz(server, node):
    async with httpx.AsyncClient(base_url=base_url(server)) as client:
        ok = await client.get("/healthz")
        assert (ok.status_code, ok.text, ok.headers["content-type"]) == (200, "ok", "text/plain; charset=utf-8")

        node.pleg = (False, "PLEG is not healthy: pleg was last seen active 3m5s ago")
        failing = await client.get("/healthz")
        assert failing.status_code == 500
        assert failing.text.splitlines() == [
            "[-]pleg failed: PLEG is not healthy: pleg was last seen active 3m5s ago",
            "healthz check failed",
        ]

        verbose = await client.get("/healthz?verbose")
        assert "[+]syncloop ok" in verbose.text.splitlines()
        assert (await client.get("/healthz?exclude=pleg")).status_code == 200

        one = await client.get("/healthz/pleg")
        assert (one.status_code, one.text) == (500, "500 internal server error: PLEG is not healthy: "
                                                    "pleg was last seen active 3m5s ago\n")
        assert (await client.get("/healthz/syncloop")).text == "ok"
        node.pleg = (True, "relisted 0.2s ago")
        assert (await client.get("/healthz/pleg?verbose")).text == "ok: relisted 0.2s ago\n"
        assert (await client.get("/healthz/pleg")).text == "ok"
        assert (await client.get("/healthz/nothing")).status_code == 404


async def test_a_raising_check_fails_health_not_the_server(serve, node):
    def broken():
        raise RuntimeError("cache is gone")

    server = OpsServer("127.0.0.1:0", health_checks={"cache": broken}, pods_json=node.pods_json,
                       registry=node.registry)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=base_url(server)) as client:
            response = await client.get("/healthz")
            assert response.status_code == 500
            assert "[-]cache failed: check raised RuntimeError: cache is gone" in response.text
            assert (await client.get("/metrics")).status_code == 200
    finally:
        await server.close()


async def test_metrics_and_pods(server, node):
    node.syncs.inc(3)
    async with httpx.AsyncClient(base_url=base_url(server)) as client:
        metrics = await client.get("/metrics")
        assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "edgelet_test_syncs_total 3.0" in metrics.text.splitlines()

        pods = await client.get("/pods")
        assert pods.headers["content-type"] == "application/json"
        assert pods.json() == PODS

        node.pods = OSError("status store unreadable")
        broken = await client.get("/pods")
        assert broken.status_code == 500 and "status store unreadable" in broken.text
        assert (await client.get("/healthz")).status_code == 200


async def test_unknown_path_and_wrong_method(server):
    async with httpx.AsyncClient(base_url=base_url(server)) as client:
        assert (await client.get("/api/v1/pods")).status_code == 404
        assert (await client.get("/healthz/")).status_code == 404
        wrong = await client.post("/pods", content=b"{}")
        assert wrong.status_code == 405
        assert wrong.headers["allow"] == "GET, HEAD"


async def test_head_sends_headers_only(server):
    reader, writer = await connect(server)
    writer.write(b"HEAD /pods HTTP/1.1\r\nHost: x\r\n\r\n" + get("/pods"))
    status, head_headers, _ = await read_response(reader, head=True)
    # If HEAD had leaked a body, it would be read here as the start of the next response.
    get_status, get_headers, body = await read_response(reader)
    assert (status, get_status) == (200, 200)
    assert head_headers["content-length"] == get_headers["content-length"] == str(len(body))
    assert json.loads(body) == PODS
    writer.close()


# --- HTTP behaviour -------------------------------------------------------------------------------


async def test_keep_alive_and_pipelining(server):
    reader, writer = await connect(server)
    for _ in range(3):
        writer.write(get("/healthz"))
        assert (await read_response(reader))[0] == 200

    writer.write(get("/healthz") + get("/nope") + get("/pods") + get("/metrics", "Connection: close"))
    statuses = [(await read_response(reader))[0] for _ in range(4)]
    assert statuses == [200, 404, 200, 200]
    assert await read_to_eof(reader) == b""
    writer.close()


async def test_http10_closes_after_the_response(server):
    reader, writer = await connect(server)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    status, _, body = await read_response(reader)
    assert (status, body) == (200, b"ok")
    assert await read_to_eof(reader) == b""
    writer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS ClientHello
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400_and_close(server, garbage):
    reader, writer = await connect(server)
    writer.write(garbage)
    status, headers, _ = await read_response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert await read_to_eof(reader) == b""
    writer.close()


async def test_oversized_headers_are_rejected(server):
    reader, writer = await connect(server)
    writer.write(get("/healthz", "X-Padding: " + "a" * 64 * 1024))
    status, _, body = await read_response(reader)
    assert status == 431 and b"header fields too large" in body
    writer.close()


async def test_oversized_body_is_rejected(serve):
    server = await serve(max_body_bytes=1024)
    reader, writer = await connect(server)
    writer.write(b"GET /pods HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096)
    assert (await read_response(reader))[0] == 413
    writer.close()


async def test_slow_clients_time_out(serve):
    server = await serve(request_timeout=0.3, idle_timeout=0.3)

    # Half a request, then silence.
    reader, writer = await connect(server)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost:")
    assert (await read_response(reader))[0] == 408
    writer.close()

    # A byte at a time, never finishing: the deadline covers the whole request, not each read.
    reader, writer = await connect(server)
    request = get("/healthz", *(f"X-Slow-{i}: y" for i in range(1000)))
    answered = asyncio.ensure_future(read_response(reader))
    for byte in request:
        if answered.done():
            break
        writer.write(bytes([byte]))
        await asyncio.sleep(0.01)
    assert (await answered)[0] == 408
    writer.close()

    # An idle keep-alive connection is closed without a word.
    reader, writer = await connect(server)
    writer.write(get("/healthz"))
    assert (await read_response(reader))[0] == 200
    assert await read_to_eof(reader) == b""
    writer.close()


async def test_concurrent_clients(server):
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(base_url=base_url(server), limits=limits) as client:
        paths = ["/healthz", "/metrics", "/pods"] * 40
        responses = await asyncio.gather(*(client.get(path) for path in paths))
    assert [r.status_code for r in responses] == [200] * len(paths)


async def test_connection_limit(serve):
    server = await serve(max_connections=2)
    held = [await connect(server) for _ in range(2)]
    await asyncio.sleep(0.05)  # let the server accept both before the third arrives
    reader, writer = await connect(server)
    assert (await read_response(reader))[0] == 503
    writer.close()
    # Those already in are served as usual.
    held_reader, held_writer = held[0]
    held_writer.write(get("/healthz"))
    assert (await read_response(held_reader))[0] == 200
    for _, w in held:
        w.close()


async def test_close_ends_open_connections(node):
    server = OpsServer("127.0.0.1:0", health_checks=node.checks(), pods_json=node.pods_json, registry=node.registry)
    await server.start()
    reader, writer = await connect(server)
    writer.write(get("/healthz"))
    await read_response(reader)
    await asyncio.wait_for(server.close(), 10)
    assert await read_to_eof(reader) == b""
    writer.close()
    assert server.bound_addresses == []


def test_on_uvloop(node):
    """The agent serves on uvloop: the stream features used here (half-close, timeouts) must work there too."""

    async def scenario():
        server = OpsServer("127.0.0.1:0", health_checks=node.checks(), pods_json=node.pods_json,
                           registry=node.registry, request_timeout=0.3)
        await server.start()
        try:
            reader, writer = await connect(server)
            writer.write(b"HEAD /pods HTTP/1.1\r\nHost: x\r\n\r\n" + get("/healthz"))
            assert (await read_response(reader, head=True))[0] == 200
            assert (await read_response(reader))[2] == b"ok"
            writer.write(b"GET /healthz HTTP/1.1\r\nHost:")
            assert (await read_response(reader))[0] == 408
            assert await read_to_eof(reader) == b""
            writer.close()

            reader, writer = await connect(server)
            writer.write(b"\x16\x03\x01 not http\r\n\r\n")
            assert (await read_response(reader))[0] == 400
            writer.close()
        finally:
            await server.close()

    uvloop.run(scenario())


# --- other address forms --------------------------------------------------------------------------


async def test_unix_socket(serve, tmp_path):
    path = tmp_path / "ops.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket left behind by a crashed run
    stale.close()

    server = await serve(f"unix:{path}")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    transport = httpx.AsyncHTTPTransport(uds=str(path))
    async with httpx.AsyncClient(transport=transport, base_url="http://edgelet") as client:
        assert (await client.get("/healthz")).text == "ok"
    await server.close()
    assert not path.exists()


async def test_unix_path_that_is_not_a_socket_is_left_alone(serve, tmp_path):
    path = tmp_path / "ops.sock"
    path.write_text("precious")
    with pytest.raises(ListenError, match=f"cannot listen on unix:{path}: .*not a socket"):
        await serve(f"unix:{path}")
    assert path.read_text() == "precious"


def _ops_server(address: str) -> OpsServer:
    return OpsServer(address, health_checks={}, pods_json=lambda: b"{}", registry=Registry())


async def test_an_address_in_use_is_one_line_naming_it_and_binds_nothing_else(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    first = _ops_server(f"unix:{tmp_path / 'first.sock'}")
    try:
        with pytest.raises(ListenError) as caught:
            await bind_all([first, _ops_server(f"127.0.0.1:{port}")])
        assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
        assert first.bound_addresses == [] and not (tmp_path / "first.sock").exists(), \
            "a listener bound before the failure must be closed again"
    finally:
        taken.close()


async def test_ipv6_loopback(serve):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 support")
    try:
        server = await serve("[::1]:0")
    except ListenError as err:
        pytest.skip(f"no IPv6 loopback here: {err}")
    assert server.bound_addresses[0].host == "::1"
    async with httpx.AsyncClient(base_url=base_url(server)) as client:
        assert (await client.get("/healthz")).text == "ok"


@pytest.mark.parametrize(("host", "family"), [("127.0.0.1", socket.AF_INET), ("localhost", None), ("", None)])
def test_an_ip_address_is_bound_before_the_loop_sees_it(host, family):
    sock = bound_ip_socket(host, 0)
    if family is None:  # a name or every interface: left to the loop's resolver
        assert sock is None
        return
    try:
        assert sock.family == family and sock.getsockname()[0] == host and sock.getsockname()[1] > 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
    finally:
        sock.close()


async def test_a_host_name_is_still_resolved_and_served(serve):
    server = await serve("localhost:0")
    async with httpx.AsyncClient(base_url=f"http://localhost:{server.bound_addresses[0].port}") as client:
        assert (await client.get("/healthz")).text == "ok"
