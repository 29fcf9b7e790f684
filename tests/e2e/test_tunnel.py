"""kubectl logs, exec, attach, port-forward and cp through konnectivity: kube-apiserver 1.36 sends its traffic
to nodes (egress `cluster`, GRPC over a unix socket) to konnectivity-server, built from Debian's source
(hack/konnectivity.sh), and the agent's own Connect streams carry it to the kubelet API, which the apiserver
cannot reach directly (it listens on 127.0.0.2, the node's name resolves to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.conftest import (
    REPO,
    AuditLog,
    Kubectl,
    _cannot_run,
    kubelet_serving_cert,
    loopback_node_name,
    running_control_plane,
)
from tests.e2e.harness import Background, download_mb_s, on_terminal, run_pod
from tests.helpers import wait_for
from tests.integration.agent_harness import port_open

pytestmark = pytest.mark.containerd

KONNECTIVITY = REPO / "hack" / "konnectivity.sh"
KUBELET_HOST = "127.0.0.2"  # on loopback, but not where the node's name (127.0.0.1) leads


def low_port() -> int:
    """A free port below 32768: konnectivity-server refuses ephemeral ports for its listeners."""
    while True:
        port = random.randint(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@pytest.fixture(scope="module")
def konnectivity_server_binary() -> Path:
    if os.geteuid() != 0:
        _cannot_run("needs root (the konnectivity build fetches Debian packages)")
    built = subprocess.run(["bash", str(KONNECTIVITY), "build"], capture_output=True, text=True, timeout=1800)
    if built.returncode != 0:
        pytest.fail(f"hack/konnectivity.sh build failed:\n{built.stderr[-4000:]}", pytrace=False)
    return Path(built.stdout.strip().splitlines()[-1])


class KonnectivityServer:
    """One konnectivity-server instance on loopback: agent port (TLS, agents' client certificates checked against
    `client_ca`), frontend on a unix socket for the apiserver, health and admin ports."""

    def __init__(self, binary: Path, directory: Path, server_id: str, *, count: int, client_ca: Path, pki: Path):
        self.binary, self.server_id, self.count = binary, server_id, count
        self.uds = directory / f"konnectivity-{server_id}.sock"
        self.log = directory / f"konnectivity-{server_id}.log"
        self.agent_port, self.health_port, self.admin_port = low_port(), low_port(), low_port()
        self.client_ca, self.pki = client_ca, pki
        self.proc: subprocess.Popen | None = None

    @property
    def agent_address(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def start(self) -> KonnectivityServer:
        args = [str(self.binary), "--mode=grpc", f"--uds-name={self.uds}", "--delete-existing-uds-file",
                "--server-port=0", f"--agent-port={self.agent_port}", "--agent-bind-address=127.0.0.1",
                f"--health-port={self.health_port}", "--health-bind-address=127.0.0.1",
                f"--admin-port={self.admin_port}", "--admin-bind-address=127.0.0.1",
                f"--cluster-cert={self.pki / 'apiserver.crt'}", f"--cluster-key={self.pki / 'apiserver.key'}",
                f"--cluster-ca-cert={self.client_ca}", f"--server-count={self.count}", f"--server-id={self.server_id}",
                "--proxy-strategies=destHost,default", "--enable-profiling=false", "-v=2"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        wait_for(lambda: self.proc.poll() is not None or (port_open(self.agent_port) and self.uds.exists()), 30,
                 what=f"konnectivity-server {self.server_id} listening")
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


EGRESS = """apiVersion: apiserver.k8s.io/v1beta1  # the only version 1.36 reads
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: {uds}
"""


class Tunnelled:
    """The control plane whose traffic to nodes goes through konnectivity-server instance "a"."""

    def __init__(self, directory: Path, binary: Path):
        self.directory, self.binary = directory, binary
        self.servers: list[KonnectivityServer] = []

    def server(self, server_id: str, *, count: int, client_ca: Path | None = None) -> KonnectivityServer:
        pki = self.directory / "pki"
        server = KonnectivityServer(self.binary, self.directory, server_id, count=count,
                                    client_ca=client_ca or pki / "ca.crt", pki=pki)
        self.servers.append(server)
        return server


@pytest.fixture(scope="module")
def tunnelled(tmp_path_factory, konnectivity_server_binary) -> Iterator[Tunnelled]:
    directory = tmp_path_factory.mktemp("tunnel-plane")
    here = Tunnelled(directory, konnectivity_server_binary)
    first = here.server("a", count=2)
    (directory / "egress.yaml").write_text(EGRESS.format(uds=first.uds))
    with running_control_plane(directory, loopback_node_name(), EDGELET_E2E_KCM="0",
                               EDGELET_E2E_EGRESS_SELECTOR_CONFIG=str(directory / "egress.yaml")) as plane:
        here.plane = plane
        try:
            yield here
        finally:
            for server in here.servers:
                server.stop()


# The conftest's fixtures of the same names, for this module's control plane.
@pytest.fixture(scope="module")
def control_plane(tunnelled):
    return tunnelled.plane


@pytest.fixture(scope="module")
def kubectl(control_plane) -> Kubectl:
    return Kubectl(control_plane.admin_kubeconfig)


@pytest.fixture(scope="module")
def audit(control_plane) -> AuditLog:
    return AuditLog(control_plane.audit_log)


def tunnel_toml(control_plane, servers: list[KonnectivityServer], port: int) -> str:
    cert, key = kubelet_serving_cert(control_plane, control_plane.node)
    addresses = ", ".join(f'"{s.agent_address}"' for s in servers)
    return (f'\n[kubelet_api]\naddress = "{KUBELET_HOST}:{port}"\ntls_cert_file = "{cert}"\n'
            f'tls_private_key_file = "{key}"\n\n[cluster.tunnel]\nservers = [{addresses}]\n')


def ops(agent, path: str) -> str:
    """GET on the agent's ops endpoint; the body whatever the status."""
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://{agent.ops_address}{path}", timeout=10) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.read().decode()


def health_detail(agent) -> str:
    return ops(agent, "/healthz/tunnel?verbose")


def metric(agent, name: str) -> float:
    """The sum of the samples whose name (and labels) start with `name`."""
    total = 0.0
    for line in ops(agent, "/metrics").splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_agent(cluster_agent, control_plane, servers: list[KonnectivityServer]):
    port, ops_port = low_port(), low_port()
    agent = cluster_agent(tunnel_toml(control_plane, servers, port), server_address=f"127.0.0.1:{ops_port}")
    agent.kubelet_api_port, agent.ops_address = port, f"127.0.0.1:{ops_port}"
    wait_for(lambda: port_open(ops_port), 60, interval=0.3, what="the ops endpoint")
    return agent


def streams_connected(agent) -> int:
    return int(metric(agent, "edgelet_tunnel_streams "))


@pytest.fixture(scope="module")
def servers(tunnelled) -> list[KonnectivityServer]:
    first = tunnelled.servers[0]
    second = tunnelled.server("b", count=2)
    first.start()
    second.start()
    return [first, second]


@pytest.fixture
def node(cluster_agent, control_plane, kubectl, servers):
    agent = start_agent(cluster_agent, control_plane, servers)
    wait_for(lambda: "True" in kubectl("get", "node", control_plane.node, "-o",
                                       "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False), 60,
             interval=0.5, what="node Ready")
    wait_for(lambda: streams_connected(agent) == 2, 60, interval=0.5, what="a stream to each konnectivity-server")
    return agent


def test_kubectl_reaches_the_kubelet_api_only_through_the_tunnel(node, kubectl, control_plane, servers, tunnelled):
    # The apiserver would dial the node's Hostname address: nothing listens there.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((control_plane.node, node.kubelet_api_port), timeout=5).close()
    assert port_open(node.kubelet_api_port, host=KUBELET_HOST)

    # One stream per announced server instance, each to a different server id.
    detail = health_detail(node)
    assert "2/2 konnectivity streams" in detail and "a at " in detail and "b at " in detail, detail

    run_pod(kubectl, node, "shell", "i=0; while true; do i=$((i+1)); echo line $i; sleep 0.3; done")
    follow = Background(kubectl, "logs", "-f", "shell")
    try:
        assert "line" in follow.read_until("\n") and "line" in follow.read_until("\n")
    finally:
        follow.stop()
    result = kubectl.run("exec", "shell", "--", "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
    assert (result.returncode, result.stdout) == (3, "out\n") and "err" in result.stderr
    output, code = on_terminal(kubectl, "exec", "-it", "shell", "--", "sh", "-c",
                               "test -t 1 && sleep 1 && stty size; exit 5")
    assert code == 5 and output.splitlines()[0].strip() == "30 100", repr(output)
    attach = Background(kubectl, "attach", "shell", "-c", "main")
    try:
        assert "line" in attach.read_until("\n")
    finally:
        attach.stop()

    # kubectl cp both ways (tar over exec).
    source = tunnelled.directory / "payload.bin"
    source.write_bytes(os.urandom(256 * 1024))
    kubectl("cp", str(source), "default/shell:/tmp/payload.bin", timeout=120)
    back = tunnelled.directory / "payload.back"
    kubectl("cp", "default/shell:/tmp/payload.bin", str(back), timeout=120)
    assert back.read_bytes() == source.read_bytes()

    # The figures: exec round trip and port-forward throughput through the tunnel (test_kubelet_api prints the
    # direct ones in the same run).
    times = []
    for _ in range(5):
        started = time.monotonic()
        kubectl("exec", "shell", "--", "true")
        times.append(time.monotonic() - started)
    port, size_mb = low_port(), 32
    run_pod(kubectl, node, "bulk", f"mkdir -p /tmp/www && dd if=/dev/zero of=/tmp/www/big bs=1M count={size_mb} "
                                   f"2>/dev/null && exec httpd -f -p 127.0.0.1:{port} -h /tmp/www",
            extra_spec={"hostNetwork": True})
    wait_for(lambda: port_open(port), 20, what="httpd")
    local = low_port()
    forward = Background(kubectl, "port-forward", "pod/bulk", f"{local}:{port}")
    try:
        forward.read_until("Forwarding from 127.0.0.1")
        rates = [download_mb_s(f"http://127.0.0.1:{local}/big", size_mb << 20) for _ in range(3)]
    finally:
        forward.stop()
    print(f"\nthrough konnectivity: kubectl exec -- true median {sorted(times)[2] * 1000:.0f} ms over 5; "
          f"port-forward of {size_mb} MiB best of 3 {max(rates):.0f} MB/s")
    assert metric(node, 'edgelet_tunnel_dials_total{result="spliced"}') >= 8
    assert metric(node, 'edgelet_tunnel_bytes_total{direction="from_server"}') > 0
    assert metric(node, 'edgelet_tunnel_bytes_total{direction="to_server"}') > size_mb << 20

    # `edgelet describe node` offline, from what the agent recorded.
    node.stop()
    described = node.cli("describe", "node").stdout
    assert "Tunnel:" in described and servers[0].agent_address in described and "host=" in described, described


async def _dial_through_frontend(uds: Path, address: str) -> str:
    """A DIAL_REQ as the apiserver sends it, on konnectivity-server's frontend; the DIAL_RSP's error."""
    from edgelet.tunnel import konnectivity_pb2 as pb

    async with grpc.aio.insecure_channel(f"unix://{uds}") as channel:
        proxy = channel.stream_stream("/ProxyService/Proxy", request_serializer=pb.Packet.SerializeToString,
                                      response_deserializer=pb.Packet.FromString)
        call = proxy()
        await call.write(pb.Packet(type=pb.DIAL_REQ, dialRequest=pb.DialRequest(protocol="tcp", address=address,
                                                                               random=424242)))
        reply = await asyncio.wait_for(call.read(), 30)
        call.cancel()
        assert reply.type == pb.DIAL_RSP and reply.dialResponse.random == 424242, reply
        return reply.dialResponse.error


def test_a_dial_to_another_address_is_refused_and_counted(node, servers, control_plane):
    other = f"{control_plane.node}:22"
    error = asyncio.run(_dial_through_frontend(servers[0].uds, other))
    assert "may not be dialled" in error, error
    assert metric(node, "edgelet_tunnel_dials_refused_total") == 1
    assert "1 dials refused" in health_detail(node)
    # while the kubelet API itself is dialled (the frontend answers with a connection id)
    assert asyncio.run(_dial_through_frontend(servers[0].uds, f"{control_plane.node}:{node.kubelet_api_port}")) == ""


def test_a_restarted_konnectivity_server_gets_its_stream_back(node, kubectl, servers):
    run_pod(kubectl, node, "idle", "exec sleep 3600")
    servers[0].stop()
    wait_for(lambda: streams_connected(node) == 1, 30, interval=0.3, what="the stream to server a gone")
    servers[0].start()
    # The agent's backoff starts at 1 s (1-2 s after the first failure, doubling).
    wait_for(lambda: streams_connected(node) == 2, 60, interval=0.3, what="the stream to server a back")
    wait_for(lambda: kubectl.run("exec", "idle", "--", "echo", "back", check=False).stdout == "back\n", 30,
             interval=0.5, what="kubectl exec through the new stream")


def test_an_untrusted_client_certificate_is_refused_with_one_clear_line(tunnelled, cluster_agent, control_plane):
    other_ca = tunnelled.directory / "other-ca"
    other_ca.mkdir(exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=not-the-cluster-ca", "-keyout", str(other_ca / "ca.key"),
                    "-out", str(other_ca / "ca.crt")], check=True, capture_output=True)
    strict = tunnelled.server("strict", count=1, client_ca=other_ca / "ca.crt").start()
    try:
        agent = start_agent(cluster_agent, control_plane, [strict])
        wait_for(lambda: "client certificate" in health_detail(agent), 60, interval=0.5,
                 what="the refusal in /healthz")
        time.sleep(3)  # a few more retries, which must not add lines
        lines = [line for line in agent.log_text().splitlines()
                 if "konnectivity-server refused" in line and "still failing" not in line]  # debug: the retries
        assert len(lines) == 1, lines
        assert strict.agent_address in lines[0]
        assert re.search(r"\[-\]tunnel failed: .*client certificate", ops(agent, "/healthz")), ops(agent, "/healthz")
    finally:
        strict.stop()
