"""Service-account tokens through a real kube-apiserver: the `kube-api-access-*` volume its ServiceAccount
admission gives every pod holds a token the API accepts as the pod's service account, bound to the pod (refused
once it is gone), refreshed on schedule; the pod is told where the API server is.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
import urllib.parse

import httpx
import pytest

from tests.e2e.conftest import pod_phase, wait_pod
from tests.e2e.harness import pod_manifest
from tests.helpers import wait_for

pytestmark = pytest.mark.containerd

ACCESS_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The agent's 24 h maximum token age cut down so that a refresh happens within the test (the rule and its
# 80 % twin are table-tested in tests/unit/test_volumes_tokens.py); pods are synced every 2 s.
SHORT_MAX_AGE = 'service_account_token_max_age = "15s"\n'
FAST_SYNC = '\n[sync]\nsync_frequency = "2s"\n'


def _review(kubectl, token: str) -> dict:
    """The API server's TokenReview of `token` (as the cluster admin)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    return json.loads(kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)))["status"]


def _api_as(control_plane, token: str, path: str) -> httpx.Response:
    tls = ssl.create_default_context(cafile=str(control_plane.dir / "pki" / "ca.crt"))
    return httpx.get(control_plane.server + path, headers={"Authorization": f"Bearer {token}"}, verify=tls)


def _access_volume(pod: dict) -> str:
    [name] = [v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    return name


def _start_reader(kubectl, control_plane) -> dict:
    kubectl("create", "serviceaccount", "reader")
    kubectl.apply(pod_manifest("token-reader", control_plane.node, "exec sleep 3600",
                               extra_spec={"serviceAccountName": "reader"}))
    return wait_pod(kubectl, "token-reader", lambda p: pod_phase(p) == "Running", 60)


def test_a_pod_reaches_the_api_as_its_service_account_until_it_is_deleted(cluster_agent, control_plane, kubectl):
    agent = cluster_agent(FAST_SYNC)
    try:
        pod = _start_reader(kubectl, control_plane)
        token = kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/token")
        assert kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/namespace") == "default"
        ca = kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/ca.crt")
        assert ca == (control_plane.dir / "pki" / "ca.crt").read_text()

        status = _review(kubectl, token)
        assert status["authenticated"] is True
        user = status["user"]
        assert user["username"] == "system:serviceaccount:default:reader"
        assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["token-reader"]
        assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
        # Used as a client would: authenticated as the service account, which RBAC does not let list pods.
        answer = _api_as(control_plane, token, "/api/v1/namespaces/default/pods")
        assert answer.status_code == 403, answer.text
        assert 'User "system:serviceaccount:default:reader" cannot list resource "pods"' in answer.json()["message"]

        # The file as the kubelet writes it: the volume's defaultMode (0644), through ..data.
        volume = agent.root_dir / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~projected" / \
            _access_volume(pod)
        assert os.readlink(volume / "token") == "..data/token"
        assert stat.S_IMODE(os.stat(volume / "token").st_mode) == 0o644
        # The token stays in the pod's volume: not in the agent's log nor in its cache and state files.
        assert token not in agent.log_text()
        for directory, _, files in os.walk(agent.root_dir):
            if "/pods/" in directory + "/":
                continue
            for name in files:
                path = os.path.join(directory, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as stream:
                        assert token.encode() not in stream.read(), path

        # Where client-go's InClusterConfig looks for the API: the server this agent uses (no kube-proxy here).
        env = dict(line.split("=", 1) for line in kubectl("exec", "token-reader", "--", "env").splitlines()
                   if "=" in line)
        server = urllib.parse.urlsplit(control_plane.server)
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (server.hostname, str(server.port))
        assert env["KUBERNETES_PORT"] == f"tcp://{server.hostname}:{server.port}"

        # A restarted agent serves the token on disk until its refresh is due: no TokenRequest, same file.
        asked = len(agent_token_requests(control_plane))
        agent.stop()
        agent.start()
        current = f"the service-account token of volume {_access_volume(pod)} is current"
        wait_for(lambda: agent.log_text().rsplit("edgelet starting", 1)[-1].count(current) >= 3, 60,
                 interval=0.5, what="the restarted agent syncing the pod three times")
        wait_for(lambda: kubectl.ok("exec", "token-reader", "--", "true"), 30, interval=0.5,
                 what="the restarted agent's kubelet API")
        assert kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/token") == token
        assert len(agent_token_requests(control_plane)) == asked

        kubectl("delete", "pod", "token-reader", "--wait=true", timeout=60)
        # Bound to the pod: once it is gone the API refuses its token. Not at once: kube-apiserver caches a token's
        # successful authentication for 10 s (its built-in authenticators' TokenSuccessCacheTTL) and looks the pod
        # up in an informer's cache first, so the refusal follows the delete by up to about that much.
        wait_for(lambda: _review(kubectl, token).get("authenticated", False) is False, 30, interval=1,
                 what="the API server refusing the deleted pod's token")  # false is left out of the answer
        assert _api_as(control_plane, token, "/api/v1/namespaces/default/pods").status_code == 401
    finally:
        kubectl.run("delete", "pod", "token-reader", "--grace-period=0", "--force", check=False)
        kubectl.run("delete", "serviceaccount", "reader", check=False)


def test_the_token_is_refreshed_on_schedule_and_both_stay_valid(cluster_agent, control_plane, kubectl):
    cluster_agent(FAST_SYNC, cluster_settings=SHORT_MAX_AGE)
    try:
        pod = _start_reader(kubectl, control_plane)
        first = kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/token")
        second = wait_for(lambda: (lambda t: t if t != first else None)(
            kubectl("exec", "token-reader", "--", "cat", f"{ACCESS_DIR}/token")), 90, interval=1,
            what="a refreshed token in the pod")
        # Both are tokens of this pod; the old one is still valid (refreshed ahead of its end, not after).
        for token in (first, second):
            user = _review(kubectl, token)["user"]
            assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
        requests = agent_token_requests(control_plane)
        assert len(requests) >= 2 and {e["responseStatus"]["code"] for e in requests} == {201}
    finally:
        kubectl.run("delete", "pod", "token-reader", "--grace-period=0", "--force", check=False)
        kubectl.run("delete", "serviceaccount", "reader", check=False)


def agent_token_requests(control_plane) -> list[dict]:
    from tests.e2e.conftest import AuditLog

    return [e for e in AuditLog(control_plane.audit_log).events(user=f"system:node:{control_plane.node}")
            if (e.get("objectRef") or {}).get("subresource") == "token" and e.get("verb") == "create"]
