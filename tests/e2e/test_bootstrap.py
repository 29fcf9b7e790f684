"""Zero-touch join against the real control plane: a bootstrap token, the CSR API with kube-controller-manager's
approver and signer, kubeadm's RBAC for node bootstrap, and client-certificate rotation.

The operator side is done with kubectl, as kubeadm does it: a token Secret in kube-system, the cluster-info
ConfigMap in kube-public (signed by the bootstrapsigner), and the ClusterRoleBindings for system:bootstrappers
and system:nodes.
"""

from __future__ import annotations

import base64
import calendar
import datetime
import json
import re
import secrets
import string
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    ControlPlane,
    Kubectl,
    condition,
    free_port,
    loopback_node_name,
    now,
    pod_phase,
    running_control_plane,
    wait_pod,
)
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, is_running, unmount_under
from tests.runtime_cleanup import empty_runtime_at

pytestmark = pytest.mark.containerd

IMAGE = "docker.io/library/busybox:local"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
# The signer backdates notBefore by 5 min; a certificate shorter than 8 h ends the duration after it was signed.
# 90s gives certificates usable for 90 s, rotated 70-90 % into their 6.5 min from notBefore: at once or at most
# ~50 s after they were issued.
ROTATION_SIGNING_DURATION = "90s"

KUBEADM_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kubeadm:kubelet-bootstrap}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-bootstrapper}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:bootstrappers}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kubeadm:node-autoapprove-bootstrap}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,
          name: system:certificates.k8s.io:certificatesigningrequests:nodeclient}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:bootstrappers}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kubeadm:node-autoapprove-certificate-rotation}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,
          name: system:certificates.k8s.io:certificatesigningrequests:selfnodeclient}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:nodes}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: kubeadm:bootstrap-signer-clusterinfo, namespace: kube-public}
rules:
- {apiGroups: [""], resources: [configmaps], resourceNames: [cluster-info], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kubeadm:bootstrap-signer-clusterinfo, namespace: kube-public}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: kubeadm:bootstrap-signer-clusterinfo}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: system:anonymous}]
"""


def prepare_cluster(plane: ControlPlane, kubectl: Kubectl) -> None:
    """What `kubeadm init` sets up for joining nodes: RBAC and the cluster-info ConfigMap (idempotent)."""
    kubectl.run("apply", "-f", "-", input=KUBEADM_RBAC)
    ca_data = base64.b64encode((plane.dir / "pki" / "ca.crt").read_bytes()).decode()
    kubeconfig = (f"apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n"
                  f"    certificate-authority-data: {ca_data}\n    server: {plane.server}\n"
                  f"contexts: []\ncurrent-context: \"\"\nusers: []\n")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "cluster-info", "namespace": "kube-public"}, "data": {"kubeconfig": kubeconfig}}
    if kubectl.get("configmap", "cluster-info", "kube-public") is None:
        kubectl.run("create", "-f", "-", input=json.dumps(configmap))


def new_token(kubectl: Kubectl) -> str:
    """A bootstrap token Secret as `kubeadm token create` writes it; returns once the bootstrapsigner signed
    cluster-info with it."""
    alphabet = string.ascii_lowercase + string.digits
    token_id = "".join(secrets.choice(alphabet) for _ in range(6))
    token_secret = "".join(secrets.choice(alphabet) for _ in range(16))
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
        "stringData": {"token-id": token_id, "token-secret": token_secret,
                       "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true"},
    }
    kubectl.run("create", "-f", "-", input=json.dumps(secret))
    wait_for(lambda: f"jws-kubeconfig-{token_id}" in (kubectl.get("configmap", "cluster-info", "kube-public")
                                                      or {}).get("data", {}),
             60, interval=0.3, what="the bootstrapsigner to sign cluster-info")
    return f"{token_id}.{token_secret}"


def ca_cert_hash(ca_file: Path) -> str:
    """kubeadm's documented recipe: sha256 of the CA's DER public key, with openssl."""
    pubkey = subprocess.run(["openssl", "x509", "-pubkey", "-noout", "-in", str(ca_file)], capture_output=True,
                            check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pubkey, capture_output=True,
                         check=True).stdout
    digest = subprocess.run(["openssl", "dgst", "-sha256", "-hex"], input=der, capture_output=True,
                            check=True).stdout.decode()
    return "sha256:" + digest.split("=")[-1].strip()


def join_toml(plane: ControlPlane, token: str, *, ca_file: Path | None = None, ca_hash: str = "",
              kubelet_api: str = "") -> str:
    ca = f'ca_file = "{ca_file}"' if ca_file else f'ca_cert_hash = "{ca_hash}"'
    return f"""
[cluster]
server = "{plane.server}"
{ca}
bootstrap_token = "{token}"
lease_duration = "8s"
lease_renew_interval = "2s"
node_status_update_frequency = "2s"
status_resync = "2s"

[kubelet_api]
address = "127.0.0.1:{free_port()}"
{kubelet_api}
"""


def kubelet_api_trusts_cluster_clients(port: int, plane: ControlPlane, *, verify_server: bool = False) -> bool:
    """A TLS handshake with the apiserver's kubelet client certificate is accepted and authenticated (and, with
    `verify_server`, the serving certificate is the cluster CA's, for 127.0.0.1)."""
    import ssl
    import urllib.request

    pki = plane.dir / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if not verify_server:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the self-signed serving certificate
    context.load_cert_chain(pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key")
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def csrs_of(kubectl: Kubectl, username: str) -> list[dict]:
    return [csr for csr in kubectl.json("get", "csr")["items"] if csr["spec"].get("username") == username]


def _epoch_gmt(text: str) -> float:
    return calendar.timegm(time.strptime(text, "%b %d %H:%M:%S %Y GMT"))


def not_after(csr: dict) -> float:
    pem = base64.b64decode(csr["status"]["certificate"])
    out = subprocess.run(["openssl", "x509", "-noout", "-enddate"], input=pem, capture_output=True,
                         check=True).stdout.decode()
    return _epoch_gmt(out.strip().split("=", 1)[1].replace("  ", " "))


def is_ready(kubectl: Kubectl, node: str) -> bool:
    return condition(kubectl.get("node", node, None) or {}, "Ready") == "True"


@pytest.fixture
def agents(containerd, tmp_path: Path):
    """Starts agents with a given [cluster] table; stops them, their pods and their Node objects afterwards."""
    started: list[tuple[AgentProcess, Kubectl]] = []

    def start(node: str, toml: str, kubectl: Kubectl, *, start: bool = True) -> AgentProcess:
        agent = AgentProcess(tmp_path / f"agent-{node}", containerd.endpoint, node_name=node, extra_toml=toml)
        started.append((agent, kubectl))
        return agent.start() if start else agent

    yield start
    for agent, _ in started:
        agent.stop()
    empty_runtime_at(containerd.endpoint)
    for agent, kubectl in started:
        unmount_under(agent.workdir)
        kubectl.run("delete", "pods", "--all", "-n", "default", "--grace-period=0", "--force", "--wait=false",
                    check=False)
        kubectl.run("delete", "node", agent.node_name, "--wait=false", check=False)


def _assert_joined(kubectl: Kubectl, agent: AgentProcess, token: str) -> dict:
    """The node is Ready with a certificate from exactly one CSR made with the token, as the kubelet makes it."""
    node = agent.node_name
    wait_for(lambda: is_ready(kubectl, node), 90, interval=0.3, what=f"node {node} Ready")
    [csr] = csrs_of(kubectl, f"system:bootstrap:{token.split('.')[0]}")
    assert csr["spec"]["signerName"] == CLIENT_SIGNER
    assert sorted(csr["spec"]["usages"]) == ["client auth", "digital signature", "key encipherment"]
    assert "system:bootstrappers" in csr["spec"]["groups"]
    request = base64.b64decode(csr["spec"]["request"])
    subject = subprocess.run(["openssl", "req", "-noout", "-subject", "-nameopt", "RFC2253"], input=request,
                             capture_output=True, check=True).stdout.decode()
    assert subject.strip() == f"subject=CN=system:node:{node},O=system:nodes"
    assert [c["type"] for c in csr["status"]["conditions"]] == ["Approved"]
    stored = agent.root_dir / "pki" / "kubelet-client.ckpt"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert (agent.root_dir / "pki").stat().st_mode & 0o777 == 0o700
    return csr


def test_join_with_ca_file(control_plane, kubectl, agents):
    prepare_cluster(control_plane, kubectl)
    token = new_token(kubectl)
    agent = agents("boot-cafile", join_toml(control_plane, token, ca_file=control_plane.dir / "pki" / "ca.crt"),
                   kubectl)
    _assert_joined(kubectl, agent, token)
    lease = kubectl.get("lease", agent.node_name, "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == agent.node_name
    # The kubelet API starts once joined, trusting the cluster CA from ca_file for the apiserver's client cert.
    port = int(re.search(r'address = "127\.0\.0\.1:(\d+)"', agent.config_path.read_text()).group(1))
    wait_for(lambda: kubelet_api_trusts_cluster_clients(port, control_plane), 30, interval=0.3,
             what="the kubelet API serving")
    assert "kubelet API not started" not in agent.log_text()
    assert token.split(".")[1] not in agent.log_text()  # the secret never reaches the log


def test_join_with_ca_cert_hash(control_plane, kubectl, agents):
    prepare_cluster(control_plane, kubectl)
    token = new_token(kubectl)
    pin = ca_cert_hash(control_plane.dir / "pki" / "ca.crt")
    agent = agents("boot-hash", join_toml(control_plane, token, ca_hash=pin), kubectl)
    _assert_joined(kubectl, agent, token)
    assert "discovered the cluster CA" in agent.log_text()


def test_wrong_ca_cert_hash_is_refused_with_one_clear_error(control_plane, kubectl, agents):
    prepare_cluster(control_plane, kubectl)
    token = new_token(kubectl)
    wrong = "sha256:" + "0" * 64
    agent = agents("boot-wrong", join_toml(control_plane, token, ca_hash=wrong), kubectl)
    wait_for(lambda: "not the pinned ca_cert_hash" in agent.log_text(), 30, interval=0.2, what="the refusal")
    time.sleep(5)  # a few retries later: still one line, no CSR, no Node, the agent alive
    refusals = [line for line in agent.log_text().splitlines() if "not the pinned ca_cert_hash" in line
                and "DEBUG" not in line]
    assert len(refusals) == 1, refusals
    assert wrong in refusals[0] and ca_cert_hash(control_plane.dir / "pki" / "ca.crt") in refusals[0]
    assert csrs_of(kubectl, f"system:bootstrap:{token.split('.')[0]}") == []
    assert kubectl.get("node", agent.node_name, None) is None
    assert agent.proc.poll() is None


def test_restart_reuses_the_certificate(control_plane, kubectl, agents, audit):
    prepare_cluster(control_plane, kubectl)
    token = new_token(kubectl)
    agent = agents("boot-restart", join_toml(control_plane, token, ca_file=control_plane.dir / "pki" / "ca.crt"),
                   kubectl)
    _assert_joined(kubectl, agent, token)
    rss_joined = rss_kib(agent)
    stored = (agent.root_dir / "pki" / "kubelet-client.ckpt").read_bytes()
    agent.stop()
    restarted = now()
    agent.start()
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{agent.node_name}"
    wait_for(lambda: any(e["requestURI"].startswith(lease_path) and e["responseStatus"]["code"] == 200
                         for e in audit.events(user=f"system:node:{agent.node_name}", since=restarted)),
             30, interval=0.3, what="a Lease renewal with the stored certificate after the restart")
    assert is_ready(kubectl, agent.node_name)
    # Never bootstrapped again: no second CSR, neither with the token nor as the node.
    assert len(csrs_of(kubectl, f"system:bootstrap:{token.split('.')[0]}")) == 1
    assert csrs_of(kubectl, f"system:node:{agent.node_name}") == []
    assert (agent.root_dir / "pki" / "kubelet-client.ckpt").read_bytes() == stored
    # The crypto library is loaded only to make a key and CSR: a restart with a valid certificate never loads it.
    print(f"agent RSS: {rss_joined} KiB after the token join, {rss_kib(agent)} KiB after a restart reusing the "
          "certificate")


def rss_kib(agent: AgentProcess) -> int:
    status = Path(f"/proc/{agent.proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


@pytest.fixture(scope="module")
def short_cert_plane(tmp_path_factory):
    """A control plane of its own whose signer issues certificates with 90 usable seconds (6.5 min from notBefore)."""
    with running_control_plane(tmp_path_factory.mktemp("short-cert-plane"), loopback_node_name(),
                               EDGELET_E2E_SIGNING_DURATION=ROTATION_SIGNING_DURATION) as plane:
        yield plane


def test_rotation_keeps_the_node_ready(short_cert_plane, agents):
    plane = short_cert_plane
    kubectl = Kubectl(plane.admin_kubeconfig)
    prepare_cluster(plane, kubectl)
    token = new_token(kubectl)
    agent = agents("boot-rotate", join_toml(plane, token, ca_file=plane.dir / "pki" / "ca.crt"), kubectl)
    first = _assert_joined(kubectl, agent, token)
    first_expiry = not_after(first)
    assert first_expiry - now() < 100, "the signer did not issue a short-lived certificate"

    # Rotation: a CSR made with the node's own certificate (selfnodeclient), before the first one expires.
    node_user = f"system:node:{agent.node_name}"
    rotated = wait_for(lambda: [c for c in csrs_of(kubectl, node_user) if (c.get("status") or {}).get("certificate")],
                       first_expiry - now() + 10, interval=0.5, what="a rotation CSR")[0]
    rotated_at = now()
    assert rotated_at < first_expiry, "rotated only after the certificate expired"
    assert rotated["spec"]["signerName"] == CLIENT_SIGNER

    # Past the first certificate's end, the node lives on the new one: Ready, Lease renewed, the pod watch
    # still delivering (a pod created now is started), and the pod source never lost its watch.
    wait_for(lambda: now() > first_expiry + 3, first_expiry - now() + 10, interval=0.5,
             what="the old certificate's end")
    log_mark = len(agent.log_text())
    renew = kubectl.get("lease", agent.node_name, "kube-node-lease")["spec"]["renewTime"]
    wait_for(lambda: kubectl.get("lease", agent.node_name, "kube-node-lease")["spec"]["renewTime"] != renew,
             15, interval=0.3, what="a Lease renewal after the first certificate expired")
    assert is_ready(kubectl, agent.node_name)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after-rotation"},
           "spec": {"nodeName": agent.node_name, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", "sleep 3600"]}]}}
    kubectl.run("create", "-f", "-", input=json.dumps(pod))
    wait_pod(kubectl, "after-rotation", lambda p: pod_phase(p) == "Running", 60)
    log = agent.log_text()
    assert not re.search(r"API pod source: .*(401|Unauthorized|failing|retrying)", log), log[-3000:]
    # An API error reads "... 401 Unauthorized: ...": a bare "401" also turns up in hex ids and milliseconds.
    assert not re.search(r"(^|[\s(])401\b|Unauthorized", log[log_mark:], re.M), log[log_mark:][-3000:]


def _store_expired_certificate(plane: ControlPlane, agent: AgentProcess) -> None:
    """A client certificate from the cluster CA that expired an hour ago, where the agent keeps its own."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from edgelet.util.checkpoint import CheckpointStore

    ca_key = serialization.load_pem_private_key((plane.dir / "pki" / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((plane.dir / "pki" / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{agent.node_name}")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=2))
            .not_valid_after(now - datetime.timedelta(hours=1)).sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    CheckpointStore(agent.root_dir / "pki", kind="pki").write("kubelet-client",
                                                              key_pem + cert.public_bytes(serialization.Encoding.PEM))


def test_expired_certificate_offline_keeps_pods_and_bootstraps_when_the_api_returns(short_cert_plane, agents):
    plane = short_cert_plane
    kubectl = Kubectl(plane.admin_kubeconfig)
    prepare_cluster(plane, kubectl)
    token = new_token(kubectl)
    plane.stop_apiserver()
    try:
        agent = agents("boot-expired", join_toml(plane, token, ca_file=plane.dir / "pki" / "ca.crt"), kubectl,
                       start=False)
        _store_expired_certificate(plane, agent)
        agent.write_manifest("local.yaml", busybox_manifest("local", "sleep 3600"))
        agent.start()
        # No API server and no valid certificate: the local pod runs all the same.
        wait_for(lambda: is_running(agent.pod("local")), 60, interval=0.3, what="the local pod running offline")
        assert "expired; bootstrapping again with the token" in agent.log_text()
        assert agent.proc.poll() is None
    finally:
        plane.start_apiserver()
    wait_for(lambda: is_ready(kubectl, agent.node_name), 90, interval=0.3, what="the node Ready once the API is back")
    [csr] = csrs_of(kubectl, f"system:bootstrap:{token.split('.')[0]}")
    assert (csr.get("status") or {}).get("certificate")
    assert is_running(agent.pod("local"))


def test_serving_certificate_from_the_kubelet_serving_signer(control_plane, kubectl, agents):
    """`[kubelet_api] serving_cert = "csr"`: the self-signed certificate serves until an approver (here the
    operator: kube-controller-manager approves only client certificates) approves the node's kubelet-serving
    CSR; then new connections get the cluster-signed one."""
    prepare_cluster(control_plane, kubectl)
    token = new_token(kubectl)
    agent = agents("boot-serving", join_toml(control_plane, token, ca_file=control_plane.dir / "pki" / "ca.crt",
                                             kubelet_api='serving_cert = "csr"'), kubectl)
    _assert_joined(kubectl, agent, token)
    port = int(re.search(r'address = "127\.0\.0\.1:(\d+)"', agent.config_path.read_text()).group(1))
    wait_for(lambda: kubelet_api_trusts_cluster_clients(port, control_plane), 30, interval=0.3,
             what="the kubelet API serving (self-signed)")
    assert not kubelet_api_trusts_cluster_clients(port, control_plane, verify_server=True)

    user = f"system:node:{agent.node_name}"
    [pending] = wait_for(lambda: [c for c in csrs_of(kubectl, user)
                                  if c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"], 30, interval=0.3,
                         what="the serving CSR")
    assert sorted(pending["spec"]["usages"]) == ["digital signature", "key encipherment", "server auth"]
    kubectl("certificate", "approve", pending["metadata"]["name"])
    wait_for(lambda: kubelet_api_trusts_cluster_clients(port, control_plane, verify_server=True), 30, interval=0.3,
             what="the kubelet API serving the cluster-signed certificate")
    assert "got serving certificate serial" in agent.log_text()
