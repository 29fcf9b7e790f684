"""HTTP probes and hooks in the real agent, on a standalone node and on cluster nodes alike.

One pod-network pod whose busybox httpd answers its httpGet readiness and liveness probes and whose
postStart hook GETs an HTTPS server of the test (a throwaway certificate, so unverified as the kubelet's);
the pod becomes Ready, a server that starts failing its liveness probe gets its container restarted, and
each start calls the hook. The cluster nodes: one with a kubeconfig, and one as the benchmark runs it (a
bootstrap-token join over TLS with the CA pin, its client certificate rotated, the kubelet API serving); that
joined node also moves to a rebuilt cluster (a new CA and pin) and joins it again with its token.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess, container_state, free_port
from tests.integration.cluster_harness import api_get, cluster_agent, unmount_below
from tests.kubeapi_double import ApiServerDouble
from tests.kubeapi_double.joining import CLIENT_SIGNER, ClusterPKI, cluster_info, crypto_mapped, join_toml
from tests.kubeapi_double.testcerts import TEST_CERT, TEST_KEY

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

NODE = "testnode"
# httpd on 8080 serves /tmp/www: index.html (readiness), healthz (liveness) and a CGI that deletes healthz,
# which the test calls to make the server start failing. A restarted container is a fresh rootfs: healthy again.
BREAKABLE_WEB_SERVER = (
    "mkdir -p /tmp/www/cgi-bin && echo ok > /tmp/www/index.html && echo ok > /tmp/www/healthz"
    " && printf '#!/bin/sh\\nrm -f /tmp/www/healthz\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nbroken\"\\n'"
    " > /tmp/www/cgi-bin/break && chmod +x /tmp/www/cgi-bin/break && httpd -p 8080 -h /tmp/www"
    " && exec sleep 3600"
)


class HookServer:
    """An HTTPS server on 127.0.0.1 that records each request's path and User-Agent."""

    def __init__(self, workdir: Path):
        self.requests: list[tuple[str, str]] = []
        seen = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.path, self.headers.get("User-Agent", "")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        (workdir / "hook.crt").write_text(TEST_CERT)
        (workdir / "hook.key").write_text(TEST_KEY)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(workdir / "hook.crt", workdir / "hook.key")
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def probed_pod(name: str, hook_port: int) -> dict:
    container = {
        "name": "main", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
        "command": ["sh", "-c", BREAKABLE_WEB_SERVER],
        "ports": [{"name": "web", "containerPort": 8080, "protocol": "TCP"}],  # as the API server defaults it
        "readinessProbe": {"httpGet": {"path": "/index.html", "port": "web"}, "periodSeconds": 1},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2},
        "lifecycle": {"postStart": {"httpGet": {"scheme": "HTTPS", "host": "127.0.0.1", "port": hook_port,
                                                "path": "/started"}}},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"hostNetwork": False, "restartPolicy": "Always", "terminationGracePeriodSeconds": 1,
                     "containers": [container]}}


def ready(pod: dict | None) -> bool:
    conditions = {c["type"]: c["status"] for c in ((pod or {}).get("status") or {}).get("conditions") or []}
    return conditions.get("Ready") == "True"


class StandaloneNode:
    """No [cluster], no http_url: the pod is a static manifest, seen through `edgelet pods`."""

    def __init__(self, workdir: Path, endpoint: str):
        self.agent = AgentProcess(workdir, endpoint, node_name=NODE)

    def run_pod(self, pod: dict) -> None:
        self.agent.write_manifest("probed.yaml", json.dumps(pod))
        self.agent.start()

    def pod(self, name: str) -> dict | None:
        return self.agent.pod(name)

    def close(self) -> None:
        self.agent.close()


class ClusterNode:
    """[cluster] against the API server double: the pod comes from the API and its status goes back there."""

    def __init__(self, workdir: Path, endpoint: str):
        self.api = ApiServerDouble(bookmark_interval=0.5, node_name=NODE).start()
        self.agent = cluster_agent(workdir, endpoint, self.api)
        self.workdir = workdir

    def run_pod(self, pod: dict) -> None:
        self.agent.start()
        self.api.create("pods", {**pod, "spec": {**pod["spec"], "nodeName": NODE}})

    def pod(self, name: str) -> dict | None:
        return api_get(self.api, "pods", name, "default")

    def close(self) -> None:
        self.agent.stop()
        self.api.close()
        unmount_below(self.workdir)


class JoinedNode(ClusterNode):
    """A bootstrap-token join over TLS (discovery with the CA pin, a CSR the double signs, the first certificate
    short-lived so it is rotated during the test) with the kubelet API on: the benchmark's cluster mode."""

    KUBELET_API_TOKEN = "kubelet-api-caller"

    def __init__(self, workdir: Path, endpoint: str):
        self.pki = ClusterPKI(workdir / "pki")
        self.api = ApiServerDouble(ssl_context=self.pki.server_context(), bookmark_interval=0.5,
                                   node_name=NODE).start()
        self.api.csr_signer = self.pki.sign
        self.api.token_users[self.KUBELET_API_TOKEN] = ("edgelet-test", ("system:masters",))
        self.api.authorize = lambda spec: spec.get("user") == "edgelet-test"
        self.api.create("configmaps", cluster_info(self.api.url, self.pki.ca_pem), "kube-public")
        self.kubelet_api_port = free_port()
        self.agent = AgentProcess(workdir, endpoint, node_name=NODE, extra_toml=join_toml(
            self.api.url, self.pki.ca_cert_hash(), self.kubelet_api_port))
        self.workdir = workdir

    def kubelet_api_pods(self) -> list[str]:
        unverified = ssl.create_default_context()
        unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
        request = urllib.request.Request(f"https://127.0.0.1:{self.kubelet_api_port}/pods",
                                         headers={"Authorization": f"Bearer {self.KUBELET_API_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10, context=unverified) as reply:
            return [pod["metadata"]["name"] for pod in json.loads(reply.read())["items"]]


NODES = {"standalone": StandaloneNode, "cluster": ClusterNode, "joined": JoinedNode}


@pytest.fixture(params=sorted(NODES))
def node(request, tmp_path, containerd) -> Iterator[StandaloneNode | ClusterNode]:
    made = NODES[request.param](tmp_path, containerd.endpoint)
    yield made
    made.close()


@pytest.fixture
def hook_server(tmp_path) -> Iterator[HookServer]:
    server = HookServer(tmp_path)
    yield server
    server.close()


def test_http_readiness_liveness_and_post_start_hook(node, hook_server):
    node.run_pod(probed_pod("web", hook_server.port))

    pod = wait_for(lambda: ready(p := node.pod("web")) and p, 60, interval=0.2, what="the pod Ready")
    assert container_state(pod)["restartCount"] == 0
    assert container_state(pod)["ready"] is True
    started = [r for r in hook_server.requests if r[0] == "/started"]
    assert len(started) == 1 and started[0][1].startswith("kube-lifecycle/")

    # The server starts failing its liveness probe: the container is killed and started again, and is Ready again.
    pod_ip = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{pod_ip}:8080/cgi-bin/break", timeout=5) as reply:
        assert reply.read() == b"broken"
    restarted = wait_for(lambda: (p := node.pod("web")) and container_state(p).get("restartCount", 0) >= 1
                         and ready(p) and p, 60, interval=0.2, what="the container restarted and Ready again")
    assert "terminated" in container_state(restarted)["lastState"]
    assert len([r for r in hook_server.requests if r[0] == "/started"]) >= 2  # each start runs postStart

    if isinstance(node, JoinedNode):  # the rest of what the benchmarked mode runs
        assert node.kubelet_api_pods() == ["web"]
        wait_for(lambda: node.pki.issued.count(CLIENT_SIGNER) >= 2, 60, what="the client certificate rotated")
        time.sleep(2)  # the rotated certificate in use
        assert ready(node.pod("web"))
        assert node.kubelet_api_pods() == ["web"]
        assert not crypto_mapped(node.agent.proc.pid), "cryptography was loaded into the agent"


def test_a_joined_node_pointed_at_a_rebuilt_cluster_joins_it_again_with_the_token(tmp_path, containerd):
    """The cluster is rebuilt (new CA, new pin in the config) while the node keeps its root_dir: the stored CA
    and client certificate are the old cluster's. The node discovers the new CA, drops the old certificate
    (the new server refuses it in the TLS handshake) and joins with the token; it once crashed at start."""
    first = JoinedNode(tmp_path, containerd.endpoint)
    try:
        first.agent.start()
        wait_for(lambda: api_get(first.api, "nodes", NODE), 60, interval=0.2, what="the node in the first cluster")
    finally:
        first.agent.stop()
        first.api.close()
    rebuilt_pki = ClusterPKI(tmp_path / "pki-rebuilt")
    with ApiServerDouble(ssl_context=rebuilt_pki.server_context(), bookmark_interval=0.5, node_name=NODE) as api:
        api.csr_signer = rebuilt_pki.sign
        api.create("configmaps", cluster_info(api.url, rebuilt_pki.ca_pem), "kube-public")
        agent = AgentProcess(tmp_path, containerd.endpoint, node_name=NODE, extra_toml=join_toml(
            api.url, rebuilt_pki.ca_cert_hash(), free_port()))
        agent.start()
        try:
            wait_for(lambda: api_get(api, "nodes", NODE), 60, interval=0.2, what="the node in the rebuilt cluster")
            assert rebuilt_pki.issued == [CLIENT_SIGNER]  # one CSR, made with the token
            log = agent.log_text()
            assert "predates the discovered cluster CA" in log and "Traceback" not in log
            assert agent.proc.poll() is None
        finally:
            agent.stop()
            unmount_below(tmp_path)
