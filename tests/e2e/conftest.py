"""Fixtures for end-to-end tests: the real agent on the private containerd, joined to a real control plane.

`control_plane` starts kube-apiserver, kube-controller-manager and kube-scheduler 1.36 with etcd on loopback
once per session through hack/control-plane.sh. `kubectl` drives it as an operator would, with the client of the
same release (1.36, Debian unstable's `kubectl`, taken from Debian's archive by hack/debian-archive.sh, never
whatever `kubectl` is on PATH); `audit` counts requests from the apiserver's audit log; `cluster_agent` starts
`edgelet run` joined to the cluster with the node's own client certificate and its kubelet API on a loopback port
with a serving certificate of the cluster CA.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess, free_port, unmount_under
from tests.runtime_cleanup import empty_runtime_at

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE = REPO / "hack" / "control-plane.sh"
DEBIAN_ARCHIVE = REPO / "hack" / "debian-archive.sh"
# The kubectl the suite drives the cluster with, of the control plane's release: Debian package and suite
# (`make e2e-deps` fetches it).
KUBECTL_PACKAGE = ("kubectl", "sid")
# The Prometheus that scrapes the node's kubelet port, as a Debian node would install it.
PROMETHEUS_PACKAGE = ("prometheus", "bookworm")
# Shortened cluster timings so node-lifecycle behaviour is observable in seconds (kubelet ratios kept:
# the Lease is renewed every quarter of its duration, the controller's grace covers several renewals).
LEASE_DURATION_S = 8
NODE_MONITOR_GRACE = "12s"
TOLERATION_SECONDS = 20
CLUSTER_TOML = """
[cluster]
kubeconfig = "{kubeconfig}"
lease_duration = "{lease}s"
lease_renew_interval = "{renew}s"
node_status_update_frequency = "2s"
node_status_report_frequency = "1m"
status_resync = "2s"
"""


def loopback_node_name() -> str:
    """A node name the apiserver resolves to loopback (it dials the node's Hostname address for logs/exec)."""
    hostname = socket.gethostname().lower()
    try:
        if socket.gethostbyname(hostname).startswith("127."):
            return hostname
    except OSError:
        pass
    return "localhost"


@dataclass
class ControlPlane:
    """A running control plane: its directory (PKI, kubeconfigs, logs, audit log) and API address."""

    dir: Path
    server: str
    node: str

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    def node_kubeconfig(self, node: str | None = None) -> Path:
        node = node or self.node
        path = self.dir / f"node-{node}.kubeconfig"
        if not path.exists():
            self.kubeconfig_for(f"node-{node}", f"system:node:{node}", "system:nodes")
        return path

    def kubeconfig_for(self, name: str, common_name: str, organization: str = "") -> Path:
        """A client certificate signed by the cluster CA for any user, and a kubeconfig that uses it."""
        args = ["bash", str(CONTROL_PLANE), "kubeconfig", str(self.dir), name, common_name]
        if organization:
            args.append(organization)
        subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)
        return self.dir / f"{name}.kubeconfig"

    def script(self, *args: str, timeout: float = 180) -> None:
        result = subprocess.run(["bash", str(CONTROL_PLANE), *args, str(self.dir)], capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"control-plane.sh {' '.join(args)} failed:\n{result.stderr}")

    def stop_apiserver(self) -> None:
        self.script("stop-apiserver")

    def start_apiserver(self) -> None:
        self.script("start-apiserver")

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.log"


def _cannot_run(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def running_control_plane(directory: Path, node: str, **env_knobs: str) -> Iterator[ControlPlane]:
    """hack/control-plane.sh start under `directory` with EDGELET_E2E_* knobs; stopped on exit."""
    if os.geteuid() != 0:
        _cannot_run("needs root (the control plane installs the Debian packages it runs with)")
    env = dict(os.environ, **env_knobs)
    started = subprocess.run(["bash", str(CONTROL_PLANE), "start", str(directory), node], env=env,
                             capture_output=True, text=True, timeout=1800)
    try:
        if started.returncode != 0:
            pytest.fail(f"hack/control-plane.sh start failed:\n{started.stderr[-4000:]}", pytrace=False)
        server = next(line.split("=", 1)[1] for line in (directory / "env").read_text().splitlines()
                      if line.startswith("APISERVER="))
        plane = ControlPlane(dir=directory, server=server, node=node)
        wait_for(lambda: Kubectl(plane.admin_kubeconfig).ok("get", "--raw", "/readyz"), 60,
                 what="apiserver ready for kubectl")
        yield plane
    finally:
        subprocess.run(["bash", str(CONTROL_PLANE), "stop", str(directory)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("control-plane"), loopback_node_name(),
                               EDGELET_E2E_NODE_MONITOR_GRACE=NODE_MONITOR_GRACE,
                               EDGELET_E2E_TOLERATION_SECONDS=str(TOLERATION_SECONDS)) as plane:
        yield plane


@functools.cache
def archive_binary(package: str, suite: str, name: str) -> Path:
    """usr/bin/<name> of a Debian package, extracted from Debian's archive once (make e2e-deps fetches them)."""
    fetched = subprocess.run(["bash", str(DEBIAN_ARCHIVE), "fetch", package, suite], capture_output=True, text=True,
                             timeout=600)
    binary = Path(fetched.stdout.strip() or "/nonexistent") / "usr" / "bin" / name
    if fetched.returncode != 0 or not binary.is_file():
        _cannot_run(f"{name} ({package}/{suite}) not available (make e2e-deps fetches it):\n"
                    f"{fetched.stderr[-2000:]}")
    return binary


def kubectl_binary() -> Path:
    """The suite's kubectl (KUBECTL_PACKAGE)."""
    return archive_binary(*KUBECTL_PACKAGE, "kubectl")


class Kubectl:
    """A real kubectl (one user) against the test cluster, as an operator runs it."""

    def __init__(self, kubeconfig: Path):
        self.kubeconfig = kubeconfig
        self.binary = kubectl_binary()

    def command(self, *args: str) -> list[str]:
        """The command line of `kubectl ARGS` as this user (for callers that run it themselves)."""
        return [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args]

    def run(self, *args: str, input: str | None = None, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(*args), input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def __call__(self, *args: str, **kwargs) -> str:
        return self.run(*args, **kwargs).stdout

    def ok(self, *args: str) -> bool:
        return self.run(*args, check=False).returncode == 0

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str, namespace: str | None = "default") -> dict | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        result = self.run(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {result.stderr}")
        return json.loads(result.stdout)

    def apply(self, manifest: str, namespace: str = "default") -> None:
        self.run("apply", "-n", namespace, "-f", "-", input=manifest)


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    """The admin's kubectl 1.36, which speaks WebSocket first for exec, attach, cp and port-forward."""
    return Kubectl(control_plane.admin_kubeconfig)


class AuditLog:
    """Requests as the apiserver's audit log records them (one JSON object a line, stage ResponseComplete)."""

    def __init__(self, path: Path):
        self.path = path

    def events(self, *, user: str | None = None, since: float | None = None,
               until: float | None = None) -> list[dict]:
        found = []
        if not self.path.exists():
            return found
        with open(self.path) as log:
            for line in log:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("stage") != "ResponseComplete":
                    continue
                if user is not None and event.get("user", {}).get("username") != user:
                    continue
                stamp = _epoch(event.get("requestReceivedTimestamp", ""))
                if since is not None and stamp < since:
                    continue
                if until is not None and stamp > until:
                    continue
                found.append(event)
        return found

    @staticmethod
    def describe(events: list[dict]) -> list[str]:
        """`verb uri -> code` lines, for assertion messages."""
        return [f"{e.get('verb')} {e.get('requestURI')} -> {e.get('responseStatus', {}).get('code')}"
                for e in events]


def _epoch(stamp: str) -> float:
    from datetime import datetime

    if not stamp:
        return 0.0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="session")
def audit(control_plane: ControlPlane) -> AuditLog:
    return AuditLog(control_plane.audit_log)


def cluster_toml(kubeconfig: Path) -> str:
    return CLUSTER_TOML.format(kubeconfig=kubeconfig, lease=LEASE_DURATION_S, renew=LEASE_DURATION_S / 4)


KUBELET_API_TOML = """
[kubelet_api]
address = "127.0.0.1:{port}"
tls_cert_file = "{cert}"
tls_private_key_file = "{key}"
"""


def kubelet_serving_cert(control_plane: ControlPlane, node: str) -> tuple[Path, Path]:
    """A serving certificate for the node's kubelet API signed by the cluster CA, which the apiserver
    checks it against (--kubelet-certificate-authority); made once per node."""
    pki = control_plane.dir / "pki"
    cert, key = pki / f"kubelet-{node}.crt", pki / f"kubelet-{node}.key"
    if cert.exists():
        return cert, key
    extensions = pki / f"kubelet-{node}.ext"
    extensions.write_text(f"subjectAltName=DNS:{node},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                          "keyUsage=critical,digitalSignature,keyEncipherment\n")
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-subj", f"/CN={node}", "-keyout", str(key), "-out", str(pki / f"kubelet-{node}.csr")],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(pki / f"kubelet-{node}.csr"), "-CA", str(pki / "ca.crt"),
                    "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "2", "-sha256",
                    "-extfile", str(extensions), "-out", str(cert)], check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key


@pytest.fixture
def cluster_agent(control_plane: ControlPlane, containerd, tmp_path: Path, kubectl: Kubectl):
    """Starts `edgelet run` as the control plane's node; stops it, its pods and the Node object afterwards."""
    agents: list[AgentProcess] = []

    def start(extra_toml: str = "", *, node: str | None = None, workdir: Path | None = None,
              kubeconfig: Path | None = None, server_address: str = "",
              cluster_settings: str = "") -> AgentProcess:
        node = node or control_plane.node
        # The kubelet API on a free loopback port (the Node reports it), with a cluster-signed certificate.
        port = free_port()
        cert, key = kubelet_serving_cert(control_plane, node)
        kubelet_api = "" if "[kubelet_api]" in extra_toml else KUBELET_API_TOML.format(port=port, cert=cert, key=key)
        agent = AgentProcess(workdir or tmp_path / f"agent-{len(agents)}", containerd.endpoint, node_name=node,
                             extra_toml=cluster_toml(kubeconfig or control_plane.node_kubeconfig(node))
                             + cluster_settings + kubelet_api + extra_toml, server_address=server_address)
        agent.kubelet_api_port = port
        agents.append(agent)
        return agent.start()

    yield start
    for agent in agents:
        agent.stop()
    empty_runtime_at(containerd.endpoint)
    for agent in agents:
        unmount_under(agent.workdir)
    kubectl.run("delete", "pods", "--all", "-n", "default", "--grace-period=0", "--force", "--wait=false",
                check=False)
    for agent in {a.node_name for a in agents}:
        kubectl.run("delete", "node", agent, "--wait=false", check=False)


@pytest.fixture
def node_ready(cluster_agent, control_plane, kubectl) -> AgentProcess:
    """The agent of the control plane's node, started and reported Ready."""
    agent = cluster_agent()
    wait_for(lambda: condition(kubectl.get("node", control_plane.node, None) or {}, "Ready") == "True", 60,
             interval=0.3, what="node Ready")
    return agent


def wait_pod(kubectl: Kubectl, name: str, predicate, timeout: float = 60, namespace: str = "default") -> dict:
    """Waits until the API's view of a pod satisfies `predicate`; returns that pod."""
    return wait_for(lambda: (lambda pod: pod if pod and predicate(pod) else None)(
        kubectl.get("pod", name, namespace)), timeout, interval=0.2, what=f"pod {namespace}/{name}")


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "")


def condition(obj: dict, kind: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("status", "")
    return ""


def container_status(pod: dict, name: str = "main") -> dict:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return status
    return {}


def now() -> float:
    return time.time()
