"""kubectl logs, exec, attach, port-forward and node stats through the real kube-apiserver to the agent's
kubelet API, and the kubelet API's own answers to callers who come straight to its port.

kubectl 1.36 tries WebSocket first (v5.channel.k8s.io; port-forward as SPDY tunnelled over WebSocket); the 1.36
apiserver answers that upgrade itself and speaks SPDY to the kubelet API, so the agent sees SPDY/3.1 upgrades.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.e2e.conftest import PROMETHEUS_PACKAGE, archive_binary, free_port
from tests.e2e.harness import Background, download_mb_s, on_terminal, pod_manifest, run_pod
from tests.helpers import wait_for
from tests.integration.agent_harness import port_open

pytestmark = pytest.mark.containerd


@pytest.fixture
def node(node_ready, control_plane):
    """The Ready agent; the pods of a test run on it."""
    return node_ready




def logs(kubectl, *args: str) -> str:
    return kubectl("logs", *args)





# -- logs --------------------------------------------------------------------------------------------

def test_kubectl_logs_with_its_options(node, kubectl, control_plane):
    # The pause keeps the two pipes in order: the runtime reads stdout and stderr independently.
    run_pod(kubectl, node, "talker",
            "for i in 1 2 3 4 5; do echo line $i; done; sleep 0.5; echo oops >&2; exec sleep 3600")
    wait_for(lambda: logs(kubectl, "talker").count("\n") == 6, 20, what="six lines")
    assert logs(kubectl, "talker") == "line 1\nline 2\nline 3\nline 4\nline 5\noops\n"
    assert logs(kubectl, "talker", "--tail=2") == "line 5\noops\n"
    assert logs(kubectl, "talker", "-c", "main", "--tail=1") == "oops\n"
    stamp, _, text = logs(kubectl, "talker", "--timestamps", "--tail=1").partition(" ")
    assert text == "oops\n" and "T" in stamp
    assert logs(kubectl, "talker", "--since=1h").count("\n") == 6
    assert logs(kubectl, "talker", "--limit-bytes=9") == "line 1\nli"
    missing = kubectl.run("logs", "talker", "--previous", check=False)
    assert missing.returncode != 0 and "previous" in missing.stderr


def test_kubectl_logs_previous_and_follow(node, kubectl):
    pod = "restarter"
    script = ("if [ -f /scratch/ran ]; then i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done; fi; "
              "touch /scratch/ran; echo first run; exit 1")
    kubectl.apply(pod_manifest(pod, node.node_name, script, extra_spec={
        "volumes": [{"name": "scratch", "emptyDir": {}}]},
        container={"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}))
    wait_for(lambda: "tick" in kubectl.run("logs", pod, check=False).stdout, 60, interval=0.5,
             what="the second run's output")
    assert logs(kubectl, pod, "--previous") == "first run\n"
    follow = Background(kubectl, "logs", "-f", "--tail=1", pod)
    try:
        first = follow.read_until("\n")
        number = int(first.split()[-1])
        follow.read_until(f"tick {number + 3}\n")  # lines written after the stream opened
    finally:
        follow.stop()


# -- exec and attach ---------------------------------------------------------------------------------


def test_kubectl_exec_with_stdin_tty_and_exit_codes(node, kubectl, audit):
    pod = "shell"
    run_pod(kubectl, node, pod, "exec sleep 3600")
    since, log_mark = time.time() - 1, len(node.log_text())
    result = kubectl.run("exec", pod, "--", "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
    assert (result.returncode, result.stdout) == (3, "out\n")
    assert "err" in result.stderr
    # kubectl 1.36 GETs a WebSocket upgrade (v5.channel.k8s.io) and the apiserver takes it: no SPDY fallback
    # (a POST) reaches the apiserver, and the apiserver speaks SPDY/3.1 to the kubelet API in its place.
    def exec_verbs():
        verbs = [event["verb"] for event in audit.events(since=since)
                 if event.get("objectRef", {}).get("subresource") == "exec" and event["objectRef"].get("name") == pod]
        return verbs or None  # the audit line of a session is written when it ends

    verbs = wait_for(exec_verbs, 10, interval=0.2, what="the exec in the audit log")
    assert verbs == ["get"]
    upgrades = re.findall(r"streaming (\w+) /exec: (\d+), upgrade (\S+)", node.log_text()[log_mark:])
    assert upgrades == [("POST", "101", "SPDY/3.1")], upgrades
    assert kubectl("exec", "-i", pod, "--", "sh", "-c", "cat; echo done", input="from stdin\n") == \
        "from stdin\ndone\n"
    # -t needs a terminal on kubectl's side too (else kubectl drops it): run it on a pseudo-terminal.
    output, code = on_terminal(kubectl, "exec", "-it", pod, "--", "sh", "-c", "test -t 1 && sleep 1 && stty size")
    assert code == 0 and output.split()[-2:] == ["30", "100"], repr(output)
    assert kubectl.run("exec", pod, "-c", "nosuch", "--", "true", check=False).returncode != 0


def test_kubectl_cp_both_ways(node, kubectl, tmp_path):
    """kubectl cp is tar over exec: stdin into the container, stdout out of it."""
    pod = "files"
    run_pod(kubectl, node, pod, "mkdir -p /data && exec sleep 3600")
    payload = bytes(range(256)) * 4096 + b"end"  # 1 MiB of every byte value, binary-safe both ways
    (tmp_path / "up.bin").write_bytes(payload)
    kubectl("cp", str(tmp_path / "up.bin"), f"{pod}:/data/up.bin", timeout=120)
    assert kubectl("exec", pod, "--", "wc", "-c", "/data/up.bin").split()[0] == str(len(payload))
    kubectl("cp", f"{pod}:/data/up.bin", str(tmp_path / "down.bin"), timeout=120)
    assert (tmp_path / "down.bin").read_bytes() == payload


def test_kubectl_exec_true_round_trip(node, kubectl, record_property):
    """`kubectl exec -- true` end to end, five times: each answers with the command's exit code (the figure, the
    median round trip, is recorded for the report; timings are not asserted on a shared machine)."""
    run_pod(kubectl, node, "quick", "exec sleep 3600")
    times = []
    for command in ["true", "false"] * 3:
        started = time.monotonic()
        result = kubectl.run("exec", "quick", "--", command, check=False)
        times.append(time.monotonic() - started)
        assert (result.returncode, result.stdout) == ((0 if command == "true" else 1), "")
    median_ms = sorted(times)[len(times) // 2] * 1000
    record_property("kubectl_exec_true_median_ms", round(median_ms))
    print(f"\nkubectl exec round trip: median {median_ms:.0f} ms over {len(times)}")


def test_kubectl_attach(node, kubectl):
    pod = "chatty"
    run_pod(kubectl, node, pod, "i=0; while true; do i=$((i+1)); echo chat $i; sleep 0.3; done")
    attach = Background(kubectl, "attach", pod, "-c", "main")
    try:
        assert "chat" in attach.read_until("\n")
        assert "chat" in attach.read_until("\n")  # output goes on reaching the attached client
    finally:
        attach.stop()


# -- port-forward --------------------------------------------------------------------------------------

def _serve_http(name: str, port: int, host_network: bool) -> tuple[str, dict]:
    listen = f"127.0.0.1:{port}" if host_network else str(port)
    command = (f"mkdir -p /tmp/www && echo hello from {name} > /tmp/www/index.html && "
               f"exec httpd -f -p {listen} -h /tmp/www")
    return command, {"hostNetwork": host_network}


@pytest.mark.parametrize("host_network", [True, False], ids=["host-network", "cni-network"])
def test_kubectl_port_forward_to_an_http_server(node, kubectl, host_network):
    name = "web-host" if host_network else "web-pod"
    pod_port = free_port() if host_network else 8080
    command, spec = _serve_http(name, pod_port, host_network)
    run_pod(kubectl, node, name, command, extra_spec=spec)
    local = free_port()
    forward = Background(kubectl, "port-forward", f"pod/{name}", f"{local}:{pod_port}")
    try:
        forward.read_until("Forwarding from 127.0.0.1")
        body = wait_for(lambda: _get(f"http://127.0.0.1:{local}/"), 20, interval=0.5, what="an answer")
        assert body == f"hello from {name}\n"
    finally:
        forward.stop()


def _get(url: str) -> str | None:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as reply:
            return reply.read().decode()
    except OSError:
        return None


# -- stats -------------------------------------------------------------------------------------------

METRICS_READER = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e:node-stats-reader}
rules:
- {apiGroups: [""], resources: [nodes/stats, nodes/metrics], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e:node-stats-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e:node-stats-reader}
subjects: [{kind: ServiceAccount, name: metrics-reader, namespace: default}]
"""


def test_node_stats_summary_with_a_service_account_token(node, kubectl, control_plane):
    """What metrics-server does: a ServiceAccount token at the kubelet API's port, checked by TokenReview and
    SubjectAccessReview (nodes/stats, nodes/metrics). The apiserver's node proxy (`nodes/N/proxy/...`) is no way
    in here: a 1.36 apiserver refuses to proxy to a loopback node address."""
    run_pod(kubectl, node, "measured", "exec sleep 3600")
    kubectl.run("apply", "-f", "-", input=METRICS_READER)
    token = kubectl("create", "token", "metrics-reader", "-n", "default").strip()
    pki = control_plane.dir / "pki"

    def summary_with_pod():
        summary = json.loads(_get_at(node.kubelet_api_port, pki, "/stats/summary", token))
        return summary if any(p["podRef"]["name"] == "measured" for p in summary["pods"]) else None

    summary = wait_for(summary_with_pod, 20, interval=0.5, what="the pod in the summary")
    assert summary["node"]["nodeName"] == control_plane.node
    assert summary["node"]["memory"]["workingSetBytes"] > 0
    pod = next(p for p in summary["pods"] if p["podRef"]["name"] == "measured")
    assert pod["containers"][0]["name"] == "main" and pod["containers"][0]["memory"]["workingSetBytes"] > 0
    assert "node_cpu_usage_seconds_total" in _get_at(node.kubelet_api_port, pki, "/metrics/resource", token)
    # The same token has no right to the pods' logs or exec (nodes/proxy): refused.
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get_at(node.kubelet_api_port, pki, "/pods", token)
    assert refused.value.code == 403


def _get_at(port: int, pki, path: str, token: str) -> str:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)) \
            .open(request, timeout=10) as reply:
        return reply.read().decode()


# -- straight at the port ------------------------------------------------------------------------------

def _status_at(port: int, pki, cert: str | None) -> int:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"GET /pods HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
            head = sock.recv(4096)
    return int(head.split()[1])


def test_callers_at_the_port_get_401_403_200(node, control_plane):
    control_plane.kubeconfig_for("no-rights", "no-rights")  # a cluster-signed certificate, no RBAC binding
    pki = control_plane.dir / "pki"
    port = node.kubelet_api_port
    assert _status_at(port, pki, None) == 401
    assert _status_at(port, pki, "no-rights") == 403
    assert _status_at(port, pki, "apiserver-kubelet-client") == 200


# -- figures (printed with -s; only the bytes are asserted) ------------------------------------------------

LINE = "x" * 127  # with its newline, 128 bytes: 81920 lines make 10 MiB


def test_kubectl_logs_of_a_10_mib_log(node, kubectl):
    """10 MiB of output crosses the 10 MiB rotation size: rotated and live files are read in order."""
    run_pod(kubectl, node, "big-log", f"yes {LINE} | head -n 81920; echo END; exec sleep 3600")
    wait_for(lambda: kubectl("logs", "big-log", "--tail=1") == "END\n", 60, interval=0.5, what="the whole log")
    timings = []
    for _ in range(3):
        started = time.monotonic()
        text = kubectl("logs", "big-log", timeout=120)
        timings.append(time.monotonic() - started)
        assert len(text) == 10 * 1024 * 1024 + 4 and text.endswith(f"{LINE}\nEND\n")
    print(f"\nkubectl logs, 10 MiB: best {min(timings):.2f} s of 3")




def test_port_forward_throughput_against_a_direct_connection(node, kubectl, control_plane):
    port, size_mb = free_port(), 64
    run_pod(kubectl, node, "bulk", f"mkdir -p /tmp/www && dd if=/dev/zero of=/tmp/www/big bs=1M count={size_mb} "
                                   f"2>/dev/null && exec httpd -f -p 127.0.0.1:{port} -h /tmp/www",
            extra_spec={"hostNetwork": True})
    wait_for(lambda: port_open(port), 20, what="httpd")
    local = free_port()
    forward = Background(kubectl, "port-forward", "pod/bulk", f"{local}:{port}")
    try:
        forward.read_until("Forwarding from 127.0.0.1")
        direct, forwarded = [], []
        for _ in range(3):
            direct.append(download_mb_s(f"http://127.0.0.1:{port}/big", size_mb << 20))
            forwarded.append(download_mb_s(f"http://127.0.0.1:{local}/big", size_mb << 20))
    finally:
        forward.stop()
    print(f"\nport-forward of {size_mb} MiB, best of 3: direct {max(direct):.0f} MB/s, "
          f"kubectl port-forward through the apiserver and the agent {max(forwarded):.0f} MB/s")


# -- Prometheus (Debian's prometheus package) ----------------------------------------------------------------

def _prometheus_api(port: int, path: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        return json.loads(reply.read())["data"]


def test_prometheus_scrapes_the_kubelet_port_with_a_service_account_token(node, kubectl, control_plane, tmp_path):
    """An unmodified kubelet scrape configuration: /metrics, /metrics/cadvisor and /metrics/probes with a
    ServiceAccount token allowed nodes/metrics; without credentials the target is down (401)."""
    binary = archive_binary(*PROMETHEUS_PACKAGE, "prometheus")
    run_pod(kubectl, node, "burner", "while true; do :; done",
            container={"readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}})
    kubectl.run("apply", "-f", "-", input=METRICS_READER)
    (tmp_path / "token").write_text(kubectl("create", "token", "metrics-reader", "-n", "default").strip())
    ca = control_plane.dir / "pki" / "ca.crt"
    target = f"127.0.0.1:{node.kubelet_api_port}"

    def job(name: str, path: str, token: bool = True) -> dict:
        entry = {"job_name": name, "scheme": "https", "metrics_path": path, "tls_config": {"ca_file": str(ca)},
                 "static_configs": [{"targets": [target]}]}
        if token:
            entry["authorization"] = {"credentials_file": str(tmp_path / "token")}
        return entry

    config = {"global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
              "scrape_configs": [job("kubelet", "/metrics"), job("cadvisor", "/metrics/cadvisor"),
                                 job("probes", "/metrics/probes"), job("anonymous", "/metrics/cadvisor", False)]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    prometheus = subprocess.Popen(
        [str(binary), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def targets() -> dict[str, dict] | None:
            try:
                active = _prometheus_api(port, "/api/v1/targets")["activeTargets"]
            except OSError:
                return None
            found = {t["labels"]["job"]: t for t in active}
            return found if len(found) == 4 and all(t["health"] != "unknown" for t in found.values()) else None

        found = wait_for(targets, 60, interval=1, what="every target scraped once")
        assert [found[j]["health"] for j in ("kubelet", "cadvisor", "probes")] == ["up"] * 3, found
        assert found["anonymous"]["health"] == "down" and "401" in found["anonymous"]["lastError"]

        def query(expression: str) -> list[dict]:
            return _prometheus_api(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expression}))["result"]

        cpu = wait_for(lambda: query('rate(container_cpu_usage_seconds_total{pod="burner",container="main"}[10s])'),
                       60, interval=1, what="a CPU rate of the burner")
        assert len(cpu) == 1 and float(cpu[0]["value"][1]) > 0  # it spins
        (series,) = query('container_memory_working_set_bytes{pod="burner",container="main"}')
        labels = series["metric"]
        assert labels["namespace"] == "default" and labels["image"] == "docker.io/library/busybox:local"
        assert labels["name"] and labels["name"] in labels["id"]  # the container id, in its cgroup path
        assert query('container_cpu_usage_seconds_total{pod="burner",container=""}')  # the pod's own
        assert query("machine_cpu_cores") and query("kubelet_running_pods")
        probes = query('prober_probe_total{pod="burner",probe_type="Readiness",result="successful"}')
        assert len(probes) == 1 and probes[0]["metric"]["pod_uid"]
    finally:
        prometheus.terminate()
        prometheus.wait(30)
