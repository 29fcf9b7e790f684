"""The tunnel's packet handling over a real mTLS gRPC stream and real local sockets: splicing, refusals, the
connection limit, idle timeouts and what it announces. The server end is a minimal AgentService written here
(tests/e2e/test_tunnel.py runs the real konnectivity-server)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from edgelet.config import TunnelConfig
from edgelet.metrics import registry as metrics
from edgelet.tunnel import konnectivity_pb2 as pb
from edgelet.tunnel import konnectivity_pb2_grpc as pb_grpc
from edgelet.tunnel.agent import Tunnel
from edgelet.tunnel.policy import Destinations, agent_identifiers
from edgelet.tunnel.splice import TlsSplice, tls_context
from tests.helpers import eventually
from tests.integration.agent_harness import free_port, port_open
from tests.scrape import sample_value


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=test-ca", "-keyout", str(d / "ca.key"), "-out",
            str(d / "ca.crt"))
    # A second CA, which the agent and the server do not trust: for the refusals.
    openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=other-ca", "-keyout", str(d / "other-ca.key"),
            "-out", str(d / "other-ca.crt"))
    for name, subject, ext in [("server", "/CN=konnectivity",
                                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                               ("node", "/O=system:nodes/CN=system:node:edge-1", "extendedKeyUsage=clientAuth\n")]:
        (d / f"{name}.ext").write_text(ext)
        openssl("req", "-new", *ec, "-subj", subject, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))
    return d


class Server(pb_grpc.AgentServiceServicer):
    """One konnectivity-server instance as the agent sees it: answers Connect with its id and count, then sends
    what the test queues and keeps what the agent sends."""

    def __init__(self, server_id: str = "srv-1", count: int = 1):
        self.server_id, self.count = server_id, count
        self.to_agent: asyncio.Queue = asyncio.Queue()
        self.from_agent: asyncio.Queue = asyncio.Queue()
        self.metadata: dict[str, str] = {}

    async def Connect(self, request_iterator, context):
        self.metadata = dict(context.invocation_metadata())
        await context.send_initial_metadata((("serverid", self.server_id), ("servercount", str(self.count))))

        async def receive():
            async for packet in request_iterator:
                await self.from_agent.put(packet)

        reader = asyncio.create_task(receive())
        try:
            while True:
                yield await self.to_agent.get()
        finally:
            reader.cancel()

    async def next_packet(self, timeout: float = 10.0) -> pb.Packet:
        return await asyncio.wait_for(self.from_agent.get(), timeout)


@contextlib.asynccontextmanager
async def running(pki: Path, servicer: Server, client_ca: str = "ca.crt"):
    server = grpc.aio.server()
    pb_grpc.add_AgentServiceServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([((pki / "server.key").read_bytes(), (pki / "server.crt").read_bytes())],
                                             root_certificates=(pki / client_ca).read_bytes(),
                                             require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def echo_server():
    """The "kubelet API": echoes what it reads."""
    async def handle(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@contextlib.asynccontextmanager
async def tunnel_to(pki: Path, address: str, kubelet_port: int, server_ca: str = "ca.crt", **settings):
    config = TunnelConfig(servers=(address,), **settings)
    tunnel = Tunnel(config, node_name="edge-1", identifiers=agent_identifiers("edge-1", ["10.0.0.5"]),
                    destinations=Destinations.build("edge-1", ["10.0.0.5"], f"127.0.0.1:{kubelet_port}"),
                    credentials=lambda: ((pki / server_ca).read_bytes(), (pki / "node.key").read_bytes(),
                                         (pki / "node.crt").read_bytes()))
    task = asyncio.create_task(tunnel.run())
    try:
        yield tunnel
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def dial(random_id: int, address: str) -> pb.Packet:
    return pb.Packet(type=pb.DIAL_REQ, dialRequest=pb.DialRequest(protocol="tcp", address=address, random=random_id))


def refused_total() -> float:
    return sum(sample_value(metrics.REGISTRY, "edgelet_tunnel_dials_refused_total", {"reason": r}) or 0
               for r in ("destination", "limit"))


async def test_a_dial_to_the_kubelet_api_is_spliced_and_closed_as_konnectivity_agent_does(pki):
    servicer = Server()
    async with running(pki, servicer) as address, echo_server() as kubelet, tunnel_to(pki, address, kubelet) as tunnel:
        await eventually(lambda: servicer.metadata, timeout=10)
        assert servicer.metadata["agentid"] == "edge-1"
        assert servicer.metadata["agentidentifiers"] == "host=edge-1&ipv4=10.0.0.5"
        await servicer.to_agent.put(dial(7, f"edge-1:{kubelet}"))
        answer = await servicer.next_packet()
        assert answer.type == pb.DIAL_RSP and answer.dialResponse.random == 7 and not answer.dialResponse.error
        connect_id = answer.dialResponse.connectID
        assert connect_id > 0
        await servicer.to_agent.put(pb.Packet(type=pb.DATA, data=pb.Data(connectID=connect_id, data=b"ping")))
        echoed = await servicer.next_packet()
        assert (echoed.type, echoed.data.connectID, echoed.data.data) == (pb.DATA, connect_id, b"ping")
        assert tunnel.open_connections() == 1
        await servicer.to_agent.put(pb.Packet(type=pb.CLOSE_REQ, closeRequest=pb.CloseRequest(connectID=connect_id)))
        closed = await servicer.next_packet()
        assert (closed.type, closed.closeResponse.connectID, closed.closeResponse.error) == (pb.CLOSE_RSP, connect_id,
                                                                                             "")
        assert tunnel.open_connections() == 0
        # DATA or CLOSE_REQ for a connection it does not know: CLOSE_RSP with konnectivity-agent's errors
        await servicer.to_agent.put(pb.Packet(type=pb.DATA, data=pb.Data(connectID=99, data=b"x")))
        assert (await servicer.next_packet()).closeResponse.error == "unrecognized connectID"
        await servicer.to_agent.put(pb.Packet(type=pb.CLOSE_REQ, closeRequest=pb.CloseRequest(connectID=98)))
        assert (await servicer.next_packet()).closeResponse.error == "Unknown connectID"
        healthy, detail = tunnel.health()
        assert healthy and "1/1 konnectivity streams (srv-1 at " in detail


async def test_other_destinations_and_dials_beyond_the_limit_are_refused_and_counted(pki):
    servicer = Server()
    async with running(pki, servicer) as address, echo_server() as kubelet, \
            tunnel_to(pki, address, kubelet, max_connections=1) as tunnel:
        before = refused_total()
        await servicer.to_agent.put(dial(1, f"edge-1:{kubelet + 1}"))   # the node, another port
        await servicer.to_agent.put(dial(2, "10.0.0.9:10250"))           # another host
        for expected in (1, 2):
            answer = await servicer.next_packet()
            assert answer.dialResponse.random == expected and "may not be dialled" in answer.dialResponse.error
        await servicer.to_agent.put(dial(3, f"10.0.0.5:{kubelet}"))      # the node's IP: spliced
        assert (await servicer.next_packet()).dialResponse.connectID > 0
        await servicer.to_agent.put(dial(4, f"edge-1:{kubelet}"))        # one too many
        answer = await servicer.next_packet()
        assert answer.dialResponse.random == 4 and "1 tunnel connections open" in answer.dialResponse.error
        assert refused_total() - before == 3 and tunnel.refused == 3
        assert "3 dials refused" in tunnel.health()[1]


async def test_an_idle_connection_is_closed_by_the_agent(pki):
    servicer = Server()
    async with running(pki, servicer) as address, echo_server() as kubelet, \
            tunnel_to(pki, address, kubelet, idle_timeout=0.3) as tunnel:
        await servicer.to_agent.put(dial(5, f"edge-1:{kubelet}"))
        connect_id = (await servicer.next_packet()).dialResponse.connectID
        closed = await servicer.next_packet(timeout=10)
        assert (closed.type, closed.closeResponse.connectID) == (pb.CLOSE_RSP, connect_id)
        assert tunnel.open_connections() == 0


async def test_a_slow_local_reader_holds_the_stream_instead_of_queueing_without_bound(pki):
    """Bytes for a connection whose reader stops are buffered up to connection_buffer; then the stream waits."""
    stalled = asyncio.Event()

    async def never_reads(reader, writer):
        await stalled.wait()
        writer.close()

    server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    kubelet = server.sockets[0].getsockname()[1]
    servicer = Server()
    try:
        async with running(pki, servicer) as address, tunnel_to(pki, address, kubelet,
                                                                connection_buffer=65536) as tunnel:
            await servicer.to_agent.put(dial(6, f"edge-1:{kubelet}"))
            connect_id = (await servicer.next_packet()).dialResponse.connectID
            chunk, count = b"x" * 65536, 640
            delivered = sample_value(metrics.REGISTRY, "edgelet_tunnel_bytes_total", {"direction": "from_server"}) or 0
            for _ in range(count):  # 40 MiB: far beyond the socket buffers and the connection's limit
                await servicer.to_agent.put(pb.Packet(type=pb.DATA, data=pb.Data(connectID=connect_id, data=chunk)))
            await asyncio.sleep(3)
            conn = next(iter(next(iter(tunnel._streams.values())).connections.values()))
            assert conn.writer.transport.get_write_buffer_size() <= 65536 + len(chunk)
            # The agent stopped taking DATA: what it took fits the kernel's socket buffers; the rest waits on the
            # server's side, held by gRPC's flow control.
            taken = sample_value(metrics.REGISTRY, "edgelet_tunnel_bytes_total",
                                 {"direction": "from_server"}) - delivered
            assert taken < count * len(chunk) / 2, taken
    finally:
        stalled.set()
        server.close()


async def test_a_client_certificate_the_server_does_not_trust_is_named_and_fails_the_check(pki):
    """konnectivity-server (Go's TLS) refuses an unknown client certificate with an alert after the handshake;
    `openssl s_server` trusting another CA does the same."""
    port = free_port()
    server = subprocess.Popen(["openssl", "s_server", "-quiet", "-accept", f"127.0.0.1:{port}",
                               "-cert", str(pki / "server.crt"), "-key", str(pki / "server.key"),
                               "-CAfile", str(pki / "other-ca.crt"), "-Verify", "1", "-verify_return_error"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await eventually(lambda: port_open(port), timeout=10)
        async with echo_server() as kubelet, tunnel_to(pki, f"127.0.0.1:{port}", kubelet) as tunnel:
            await eventually(lambda: not tunnel.health()[0], timeout=15)
            detail = tunnel.health()[1]
            assert "konnectivity-server refused the node's client certificate (is it signed by the CA of its " \
                   "--cluster-ca-cert?): TLS: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca" in detail, detail
            assert "_ssl.c" not in detail  # OpenSSL's words, not its source lines
    finally:
        server.kill()
        server.wait()


async def test_a_server_that_closes_after_the_handshake_is_said_so(pki):
    """gRPC's own TLS server refuses an unknown client certificate by closing, without an alert."""
    servicer = Server()
    async with running(pki, servicer, client_ca="other-ca.crt") as address, echo_server() as kubelet, \
            tunnel_to(pki, address, kubelet) as tunnel:
        await eventually(lambda: "before its first byte" in tunnel.health()[1], timeout=15)
        assert tunnel.health() == (True, f"no konnectivity stream yet ({address}: TLS: the server closed the "
                                         "connection before its first byte)")
        assert not servicer.metadata


async def test_a_server_certificate_the_agent_does_not_trust_is_named(pki):
    servicer = Server()
    async with running(pki, servicer) as address, echo_server() as kubelet, \
            tunnel_to(pki, address, kubelet, server_ca="other-ca.crt") as tunnel:
        await eventually(lambda: "not trusted" in tunnel.health()[1], timeout=15)
        assert "konnectivity-server's serving certificate is not trusted ([cluster.tunnel] ca_file): " \
               "TLS: certificate verify failed: " in tunnel.health()[1]
        assert tunnel.health()[0]  # a cut-off node rides through; the operator sees why in the detail
        assert not servicer.metadata


async def test_the_tls_splice_serves_this_process_only(pki):
    """The cleartext endpoint would hand the node's client certificate to whoever connects: another process
    is refused before any TLS connection is made."""
    accepted: list[int] = []

    async def count(reader, writer):
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    context = tls_context(*((pki / name).read_bytes() for name in ("ca.crt", "node.key", "node.crt")))
    splice = TlsSplice(f"127.0.0.1:{port}", context, connect_timeout=5)
    await splice.start()
    name = splice.target.removeprefix("unix-abstract:")
    try:
        other = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\ns.connect('\\0' + sys.argv[1])\n"
            "try:\n    s.sendall(b'PRI * HTTP/2.0')\n    closed = s.recv(1) == b''\n"
            "except (BrokenPipeError, ConnectionResetError):\n    closed = True\nprint(closed)",
            name, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(other.communicate(), 10)
        assert out.strip() == b"True" and accepted == []  # closed, and nothing dialled
        _, writer = await asyncio.open_unix_connection("\0" + name)
        await eventually(lambda: accepted, timeout=10)  # this process is spliced through
        writer.close()
    finally:
        await splice.close()
        server.close()
