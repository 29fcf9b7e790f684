"""The kubelet API of the real agent, against the private containerd and the API server double (which answers
the TokenReviews and SubjectAccessReviews): who may call it, logs with each option, exec / attach /
port-forward through containerd's streaming server over WebSocket, run, stats, pods and healthz, metrics, and the
node's logs (files under node_log_dir, units of a journal written for the test).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, fails_first_run_pod, free_port, is_running, port_open
from tests.integration.cluster_harness import CLUSTER_TOML, NODE
from tests.integration.wsclient import ChannelSocket, UpgradeRefused
from tests.kubeapi_double import ApiServerDouble, StatusError
from tests.kubeapi_double.testcerts import issue_client_cert, make_ca

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

APISERVER_USER = "kube-apiserver-kubelet-client"
TOKEN_USER = "metrics-reader"  # may read stats, nothing else
LOG_POD = f"talker-{NODE}"
WEB_PORT_HOST = 18000 + (int(time.time()) % 1000)


def allow(spec: dict) -> bool:
    """The test's RBAC: the apiserver's client may do anything on nodes; the token user only get stats."""
    attributes = spec.get("resourceAttributes") or {}
    if spec.get("user") == APISERVER_USER:
        return attributes.get("resource") == "nodes" and attributes.get("name") == NODE
    verb_and_subresource = (attributes.get("verb"), attributes.get("subresource"))
    return spec.get("user") == TOKEN_USER and verb_and_subresource == ("get", "stats")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(str(directory))
    other_ca = make_ca(str(directory), "unrelated-ca")
    return {
        "ca": ca,
        "apiserver": issue_client_cert(str(directory), ca, APISERVER_USER, "system:masters"),
        "nobody": issue_client_cert(str(directory), ca, "nobody"),
        "stranger": issue_client_cert(str(directory), other_ca, APISERVER_USER, "system:masters"),
    }


class KubeletApi:
    """The agent with its kubelet API, and clients for it."""

    def __init__(self, agent: AgentProcess, api: ApiServerDouble, port: int, pki: dict):
        self.agent = agent
        self.api = api
        self.port = port
        self.pki = pki
        self.base = f"https://127.0.0.1:{port}"

    @property
    def serving_cert(self) -> str:
        return str(self.agent.root_dir / "pki" / "kubelet.crt")

    def context(self, who: str | None = "apiserver") -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.serving_cert)
        if who is not None:
            context.load_cert_chain(*self.pki[who])
        return context

    def get(self, path: str, who: str | None = "apiserver", **kwargs) -> httpx.Response:
        with httpx.Client(verify=self.context(who), timeout=30, trust_env=False) as client:
            return client.get(self.base + path, **kwargs)

    def post(self, path: str, who: str | None = "apiserver", **kwargs) -> httpx.Response:
        with httpx.Client(verify=self.context(who), timeout=30, trust_env=False) as client:
            return client.post(self.base + path, **kwargs)

    def ws(self, target: str, **kwargs) -> ChannelSocket:
        return ChannelSocket.connect(self.port, target, self.context(), **kwargs)


def start_agent(tmp_path: Path, endpoint: str, api: ApiServerDouble, pki: dict, port: int) -> AgentProcess:
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    toml = CLUSTER_TOML.format(kubeconfig=kubeconfig) + f"""
[kubelet_api]
address = "127.0.0.1:{port}"
client_ca_file = "{pki['ca'][0]}"
node_log_dir = "{tmp_path / 'varlog'}"
journal_dir = "{tmp_path / 'journal'}"
"""
    return AgentProcess(tmp_path, endpoint, node_name=NODE, extra_toml=toml).start()


@pytest.fixture
def kubelet_api(tmp_path: Path, containerd, pki):
    api = ApiServerDouble().start()
    api.token_users = {"stats-token": (TOKEN_USER, ("readers",))}
    api.authorize = allow
    port = free_port()
    agent = start_agent(tmp_path, containerd.endpoint, api, pki, port)
    try:
        wait_for(lambda: (tmp_path / "root" / "pki" / "kubelet.key").exists() and port_open(port), 30,
                 what="the kubelet API to listen")
        yield KubeletApi(agent, api, port, pki)
    finally:
        agent.close()
        api.close()


def start_pod(api: KubeletApi, manifest: str, name: str, timeout: float = 60) -> None:
    api.agent.write_manifest(f"{name}.yaml", manifest)
    wait_for(lambda: is_running(api.agent.pod(name)), timeout, what=f"pod {name} running")


# -- who may call ----------------------------------------------------------------------------------

def test_callers_get_401_403_or_200_as_the_kubelet_answers_them(kubelet_api):
    assert kubelet_api.get("/healthz", who=None).status_code == 401
    assert kubelet_api.get("/healthz", who=None, headers={"Authorization": "Bearer wrong"}).status_code == 401
    refused = kubelet_api.get("/pods", who="nobody")
    assert refused.status_code == 403
    assert refused.text.strip() == "403 Forbidden (user=nobody, verb=get, resource=nodes, subresource=proxy)"
    assert kubelet_api.get("/healthz").status_code == 200
    # A bearer token is reviewed, then authorized per subresource.
    token = {"Authorization": "Bearer stats-token"}
    assert kubelet_api.get("/stats/summary", who=None, headers=token).status_code == 200
    assert kubelet_api.get("/pods", who=None, headers=token).status_code == 403
    # A certificate from another CA never gets past the handshake.
    with pytest.raises((ssl.SSLError, httpx.TransportError)):
        kubelet_api.get("/healthz", who="stranger")
    assert "Traceback" not in kubelet_api.agent.log_text()


def test_node_status_reports_the_port(kubelet_api):
    node = wait_for(lambda: _try(lambda: kubelet_api.api.get("nodes", NODE)), 10, what="the Node")
    assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": kubelet_api.port}}


def test_a_port_in_use_stops_the_agent_at_once_naming_the_address(tmp_path, containerd, pki):
    """Every listener is bound before anything starts (issue 12): no agent runs without its kubelet API."""
    with socket.socket() as taken, ApiServerDouble() as api:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = start_agent(tmp_path, containerd.endpoint, api, pki, port)
        try:
            assert agent.proc.wait(60) == 1
            log = agent.log_text()
            assert f"cannot run: cannot listen on 127.0.0.1:{port}: Address already in use" in log
            assert "Traceback" not in log and "edgelet starting" not in log
        finally:
            agent.close()


def test_unknown_paths_and_bad_queries_get_clear_answers(kubelet_api):
    assert kubelet_api.get("/nothing/here").status_code == 404
    bad = kubelet_api.get("/containerLogs/default/x/main?tailLines=many")
    assert bad.status_code == 400 and "tailLines" in bad.text
    missing = kubelet_api.get("/containerLogs/default/nosuchpod/main")
    assert missing.status_code == 404 and "nosuchpod" in missing.text


# -- logs --------------------------------------------------------------------------------------------

def test_container_logs_with_each_option(kubelet_api):
    start_pod(kubelet_api, busybox_manifest("talker", "for i in 1 2 3 4 5; do echo line $i; done; exec sleep 3600"),
              "talker")
    path = f"/containerLogs/default/{LOG_POD}/main"
    wait_for(lambda: kubelet_api.get(path).text.count("\n") == 5, 10, what="five log lines")
    assert kubelet_api.get(path).text == "".join(f"line {i}\n" for i in range(1, 6))
    assert kubelet_api.get(path + "?tailLines=2").text == "line 4\nline 5\n"
    assert kubelet_api.get(path + "?limitBytes=9").text == "line 1\nli"
    stamped = kubelet_api.get(path + "?timestamps=true&tailLines=1").text
    stamp, _, text = stamped.partition(" ")
    assert text == "line 5\n" and stamp.endswith(("Z", "+00:00")) and "T" in stamp
    assert kubelet_api.get(path + "?sinceTime=2999-01-01T00:00:00Z").text == ""
    assert kubelet_api.get(path + "?sinceSeconds=3600").text.count("\n") == 5
    assert kubelet_api.get(path + "?previous=true").status_code == 400  # it never restarted (the kubelet's code)
    assert kubelet_api.get(f"/containerLogs/default/{LOG_POD}/nosuch").status_code == 404


def test_previous_logs_are_the_last_terminated_run(kubelet_api):
    start_pod(kubelet_api, fails_first_run_pod("crasher", "echo first run", "echo second run; exec sleep 3600"),
              "crasher")
    path = f"/containerLogs/default/crasher-{NODE}/main"
    wait_for(lambda: kubelet_api.get(path).text == "second run\n", 30, what="the second run's log")
    assert kubelet_api.get(path + "?previous=1").text == "first run\n"


def test_follow_streams_new_lines_until_the_client_leaves(kubelet_api):
    start_pod(kubelet_api, busybox_manifest("ticker", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"),
              "ticker")
    seen = b""
    with httpx.Client(verify=kubelet_api.context(), timeout=30, trust_env=False) as client:
        with client.stream("GET", f"{kubelet_api.base}/containerLogs/default/ticker-{NODE}/main?follow=true") as reply:
            assert reply.status_code == 200
            started = time.monotonic()
            for chunk in reply.iter_bytes():
                seen += chunk
                if seen.count(b"\n") >= 8 or time.monotonic() - started > 20:
                    break
    assert seen.count(b"\n") >= 8
    # Ticks arrive as they are written: the stream reached lines written after it opened.
    assert b"tick 8\n" in seen
    assert kubelet_api.get("/healthz").status_code == 200  # the agent went on after the client left


# -- exec, attach, run ---------------------------------------------------------------------------

def _exec_target(command: list[str], **flags: str) -> str:
    query = urlencode([*(("command", part) for part in command), *flags.items()])
    return f"/exec/default/sleeper-{NODE}/main?{query}"


@pytest.fixture
def sleeper(kubelet_api):
    start_pod(kubelet_api, busybox_manifest("sleeper", "exec sleep 3600"), "sleeper")
    return kubelet_api


def test_exec_over_websocket_reports_output_and_exit_code(sleeper):
    session = sleeper.ws(_exec_target(["sh", "-c", "echo out; echo err >&2; exit 3"], output="1", error="1"))
    channels = session.collect()
    assert channels.get(1) == b"out\n"
    assert channels.get(2) == b"err\n"
    status = json.loads(channels[3])
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"][0] == {"reason": "ExitCode", "message": "3"}
    ok = sleeper.ws(_exec_target(["true"], output="1")).collect()
    assert json.loads(ok[3])["status"] == "Success"


def test_exec_with_stdin_and_with_a_terminal(sleeper):
    session = sleeper.ws(_exec_target(["sh", "-c", "read line; echo got:$line"], input="1", output="1"))
    session.send(0, b"hello\n")
    assert session.collect().get(1) == b"got:hello\n"
    tty = sleeper.ws(_exec_target(["sh", "-c", "sleep 1; stty size"], input="1", output="1", tty="1"))
    tty.send(4, json.dumps({"Width": 123, "Height": 45}).encode())
    assert tty.collect().get(1, b"").strip() == b"45 123"


def test_attach_sees_the_containers_output(kubelet_api):
    start_pod(kubelet_api, busybox_manifest("chatty", "i=0; while true; do i=$((i+1)); echo chat $i; sleep 0.2; done"),
              "chatty")
    session = kubelet_api.ws(f"/attach/default/chatty-{NODE}/main?output=1&error=1")
    got = b""
    while got.count(b"chat") < 3:
        message = session.recv()
        assert message is not None, got
        if message[0] == 1:
            got += message[1]
    session.close()
    assert b"chat " in got


def test_exec_refusals_are_plain_http_answers(sleeper):
    with pytest.raises(UpgradeRefused) as refused:
        sleeper.ws(f"/exec/default/sleeper-{NODE}/main?output=1")  # no command
    assert refused.value.status == 400 and b"command" in refused.value.body
    with pytest.raises(UpgradeRefused) as missing:
        sleeper.ws(f"/exec/default/sleeper-{NODE}/nosuch?command=true&output=1")
    assert missing.value.status == 404


def test_websocket_v5_alone_gets_the_runtimes_refusal_and_runs_nothing(sleeper):
    """kubectl >= 1.30 offers only v5.channel.k8s.io over WebSocket; an old API server passes that on. containerd
    (1.6 to 2.1) speaks v4 at most and refuses: the caller must get that refusal as a plain HTTP answer, without
    the command having run, so that it falls back to SPDY and runs it exactly once."""
    marker = "/tmp/ran-over-v5"
    with pytest.raises(UpgradeRefused) as refused:
        sleeper.ws(_exec_target(["touch", marker], output="1"), protocol="v5.channel.k8s.io")
    assert refused.value.status == 403
    checked = sleeper.ws(_exec_target(["sh", "-c", f"test -e {marker} && echo ran || echo not-run"], output="1"))
    assert checked.collect().get(1) == b"not-run\n"


def test_run_returns_the_commands_output(sleeper):
    reply = sleeper.post(f"/run/default/sleeper-{NODE}/main?cmd=echo%20ran%20here")
    assert reply.status_code == 200 and reply.text == "ran here\n"
    # A caller knows a static pod by its mirror pod's uid, the only one the API shows.
    mirror = wait_for(lambda: _try(lambda: sleeper.api.get("pods", f"sleeper-{NODE}", "default")), 30,
                      what="the mirror pod")
    assert mirror["metadata"]["uid"] != sleeper.agent.pod("sleeper")["metadata"]["uid"]
    by_uid = sleeper.post(f"/run/default/sleeper-{NODE}/{mirror['metadata']['uid']}/main?cmd=echo%20by%20uid")
    assert by_uid.status_code == 200 and by_uid.text == "by uid\n"
    assert sleeper.post(f"/run/default/sleeper-{NODE}/not-its-uid/main?cmd=true").status_code == 404


# -- port-forward ----------------------------------------------------------------------------------

def _http_pod(name: str, port: int, host_network: bool) -> str:
    script = f"mkdir -p /tmp/www && echo hello from {name} > /tmp/www/index.html && exec httpd -f -p {port} -h /tmp/www"
    if host_network:
        script = script.replace(f"-p {port}", f"-p 127.0.0.1:{port}")
    return busybox_manifest(name, script, host_network=host_network)


def port_forward_get(api: KubeletApi, pod: str, port: int) -> bytes:
    session = api.ws(f"/portForward/default/{pod}?port={port}")
    # Each channel first carries the port it serves (little-endian), then data or the error text.
    first = {session.recv()[0], session.recv()[0]}
    assert first == {0, 1}
    session.send(0, b"GET / HTTP/1.0\r\n\r\n")
    body = b""
    while (message := session.recv()) is not None:
        channel, data = message
        if channel == 0:
            body += data
            if b"hello from" in body and body.endswith(b"\n"):
                break
        elif channel == 1 and data:
            raise AssertionError(f"port-forward error: {data!r}")
    session.close()
    return body


@pytest.mark.parametrize("host_network", [True, False], ids=["host-network", "cni-network"])
def test_port_forward_reaches_an_http_server_in_the_pod(kubelet_api, host_network):
    port = WEB_PORT_HOST if host_network else 8080
    name = "webhost" if host_network else "webpod"
    start_pod(kubelet_api, _http_pod(name, port, host_network), name)
    body = wait_for(lambda: _try(lambda: port_forward_get(kubelet_api, f"{name}-{NODE}", port)), 20,
                    interval=0.5, what="an HTTP answer through port-forward")
    assert b"200 OK" in body and f"hello from {name}".encode() in body


def _try(fn):
    try:
        return fn()
    except (AssertionError, OSError, EOFError, StatusError):
        return None


# -- stats, pods, healthz ---------------------------------------------------------------------------

def test_stats_summary_has_the_node_and_the_pods(sleeper):
    def summary_with_pod():
        summary = sleeper.get("/stats/summary").json()
        return summary if any(p["podRef"]["name"] == f"sleeper-{NODE}" for p in summary["pods"]) else None

    summary = wait_for(summary_with_pod, 20, interval=0.5, what="the pod in /stats/summary")
    node = summary["node"]
    assert node["nodeName"] == NODE
    assert node["cpu"]["usageCoreNanoSeconds"] > 0
    assert node["memory"]["workingSetBytes"] > 0 and node["memory"]["availableBytes"] > 0
    assert node["fs"]["capacityBytes"] >= node["fs"]["availableBytes"] > 0
    assert "imageFs" in node["runtime"]
    pod = next(p for p in summary["pods"] if p["podRef"]["name"] == f"sleeper-{NODE}")
    assert pod["podRef"]["namespace"] == "default" and pod["podRef"]["uid"]
    assert [c["name"] for c in pod["containers"]] == ["main"]
    container = pod["containers"][0]
    assert container["cpu"]["usageCoreNanoSeconds"] >= 0
    assert container["memory"]["workingSetBytes"] > 0
    assert pod["memory"]["workingSetBytes"] > 0
    assert "network" not in pod  # a host-network pod's traffic is the node's
    # A second sample gives the CPU rate, as metrics-server reads it.
    again = sleeper.get("/stats/summary").json()
    assert "usageNanoCores" in again["node"]["cpu"]
    metrics = sleeper.get("/metrics/resource")
    assert metrics.status_code == 200
    assert f'container_memory_working_set_bytes{{container="main",namespace="default",pod="sleeper-{NODE}"}}' \
        in metrics.text


def test_stats_summary_has_the_network_of_a_cni_pod(kubelet_api):
    start_pod(kubelet_api, busybox_manifest("netpod", "exec sleep 3600", host_network=False), "netpod")

    def pod_network():
        pods = kubelet_api.get("/stats/summary").json()["pods"]
        return next((p.get("network") for p in pods if p["podRef"]["name"] == f"netpod-{NODE}"), None)

    network = wait_for(pod_network, 20, interval=0.5, what="the pod's network stats")
    assert network["name"] == "eth0" and [i["name"] for i in network["interfaces"]] == ["eth0"]
    assert network["txBytes"] >= 0 and network["rxBytes"] >= 0


def test_pods_and_healthz(sleeper):
    pods = sleeper.get("/pods").json()
    assert pods["kind"] == "PodList"
    assert f"sleeper-{NODE}" in [p["metadata"]["name"] for p in pods["items"]]
    verbose = sleeper.get("/healthz?verbose")
    assert verbose.status_code == 200 and "[+]runtime ok" in verbose.text


# -- ephemeral containers (kubectl debug) -----------------------------------------------------------------

def add_ephemeral_container(api: ApiServerDouble, pod: str, container: dict) -> dict:
    """What `kubectl debug` does: write the pod's ephemeral containers through the subresource."""
    current = httpx.get(f"{api.url}/api/v1/namespaces/default/pods/{pod}/ephemeralcontainers").json()
    current["spec"].setdefault("ephemeralContainers", []).append(container)
    reply = httpx.put(f"{api.url}/api/v1/namespaces/default/pods/{pod}/ephemeralcontainers", json=current)
    assert reply.status_code == 200, reply.text
    return reply.json()


def ephemeral_status(api: ApiServerDouble, pod: str, name: str) -> dict:
    statuses = (api.get("pods", pod, "default").get("status") or {}).get("ephemeralContainerStatuses") or []
    return next((s for s in statuses if s["name"] == name), {})


def test_ephemeral_container_joins_its_target_and_is_attached_to(kubelet_api):
    from tests.integration.cluster_harness import api_pod, running_in_api

    api = kubelet_api.api
    api.create("pods", api_pod("target", "exec sleep 3600"))
    wait_for(lambda: running_in_api(api, "target"), 60, what="target Running in the API")
    add_ephemeral_container(api, "target", {
        "name": "debugger", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
        "command": ["sh"], "stdin": True, "targetContainerName": "main",
        "terminationMessagePolicy": "File"})
    status = wait_for(lambda: "running" in (s := ephemeral_status(api, "target", "debugger")).get("state", {}) and s,
                      60, what="the ephemeral container running")
    assert status["containerID"].startswith("containerd://") and status["ready"] is False

    # Its shell reads what the attached client sends; it sees the target's processes (PID 1 is its sleep).
    session = kubelet_api.ws("/attach/default/target/debugger?input=1&output=1&error=1")
    session.send(0, b"tr '\\0' ' ' < /proc/1/cmdline; echo; echo done\n")
    got = b""
    while b"done" not in got:
        message = session.recv()
        assert message is not None, got
        if message[0] == 1:
            got += message[1]
    assert b"sleep 3600" in got, got
    session.send(0, b"exit 7\n")
    session.close()

    # It ends and stays ended: an ephemeral container is never restarted; its output is in its logs.
    ended = wait_for(lambda: "terminated" in (s := ephemeral_status(api, "target", "debugger")).get("state", {})
                     and s, 60, what="the ephemeral container terminated")
    assert (ended["state"]["terminated"]["exitCode"], ended["restartCount"]) == (7, 0)
    logs = kubelet_api.get("/containerLogs/default/target/debugger")
    assert logs.status_code == 200 and "sleep 3600" in logs.text
    time.sleep(2)  # several syncs
    assert ephemeral_status(api, "target", "debugger")["restartCount"] == 0
    assert "running" in next(s for s in api.get("pods", "target", "default")["status"]["containerStatuses"])["state"]


# -- metrics (/metrics, /metrics/cadvisor, /metrics/probes) ---------------------------------------------

def scrape(api: KubeletApi, path: str) -> dict[str, list]:
    """The samples of an endpoint by sample name, as Prometheus reads them."""
    from prometheus_client.parser import text_string_to_metric_families

    reply = api.get(path)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def one(samples: dict[str, list], name: str, **labels: str):
    found = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, [s.labels for s in samples.get(name, [])])
    return found[0]


BURNER = busybox_manifest("burner", "x=$(head -c 30000000 /dev/zero | tr '\\0' a); while true; do :; done",
                          host_network=False)


def test_metrics_endpoints_are_behind_nodes_metrics(kubelet_api):
    token = {"Authorization": "Bearer stats-token"}  # allowed nodes/stats only
    for path in ("/metrics", "/metrics/cadvisor", "/metrics/probes", "/metrics/resource"):
        refused = kubelet_api.get(path, who=None, headers=token)
        assert refused.status_code == 403 and "subresource=metrics" in refused.text, path
        assert kubelet_api.get(path, who=None).status_code == 401, path
    agent = scrape(kubelet_api, "/metrics")
    assert "kubelet_running_pods" in agent and "kubelet_pleg_relist_duration_seconds_bucket" in agent
    assert "prober_probe_total" not in agent  # on /metrics/probes, as the kubelet has it


def test_cadvisor_series_have_cadvisor_labels_and_move_with_the_container(kubelet_api):
    start_pod(kubelet_api, BURNER, "burner")
    pod = f"burner-{NODE}"
    status = kubelet_api.agent.pod("burner")
    uid = status["metadata"]["uid"]
    container_id = status["status"]["containerStatuses"][0]["containerID"].partition("://")[2]
    cpu = "container_cpu_usage_seconds_total"
    first = wait_for(lambda: (s := scrape(kubelet_api, "/metrics/cadvisor")) and any(
        x.labels["pod"] == pod and x.labels["container"] == "main" for x in s.get(cpu, [])) and s, 30, interval=0.5,
        what="the burner's series")
    labels = one(first, cpu, pod=pod, container="main").labels
    assert labels["namespace"] == "default" and labels["image"] == "docker.io/library/busybox:local"
    assert labels["name"] == container_id and labels["cpu"] == "total"
    assert container_id in labels["id"]  # its cgroup: <pod cgroup>/<id> or .../cri-containerd-<id>.scope
    pod_labels = one(first, cpu, pod=pod, container="").labels  # the pod's own cgroup
    assert uid.replace("-", "_") in pod_labels["id"] or uid in pod_labels["id"]
    assert pod_labels["image"] == "" and pod_labels["name"] == ""
    for name in ("container_memory_working_set_bytes", "container_memory_rss", "container_memory_usage_bytes",
                 "container_spec_memory_limit_bytes", "container_start_time_seconds",
                 "container_cpu_cfs_throttled_periods_total", "container_fs_usage_bytes"):
        one(first, name, pod=pod, container="main")
    one(first, "container_network_receive_bytes_total", pod=pod, container="", interface="eth0")
    one(first, "container_network_transmit_bytes_total", pod=pod, container="", interface="eth0")
    assert one(first, "machine_cpu_cores").value == os.cpu_count()
    assert one(first, "machine_memory_bytes").value > 0
    assert one(first, "container_scrape_error").value == 0
    # It burns CPU and holds 30 MB: the counters move, the working set shows it.
    time.sleep(2)
    second = scrape(kubelet_api, "/metrics/cadvisor")
    assert one(second, cpu, pod=pod, container="main").value > one(first, cpu, pod=pod, container="main").value
    assert one(second, cpu, pod=pod, container="").value >= one(second, cpu, pod=pod, container="main").value
    assert one(second, "container_memory_working_set_bytes", pod=pod, container="main").value > 30e6
    assert one(second, "container_start_time_seconds", pod=pod, container="main").value > time.time() - 300


def test_probe_results_are_counted_on_metrics_probes(kubelet_api):
    manifest = busybox_manifest("probed", "exec sleep 3600",
                                container_field='readinessProbe: {exec: {command: ["true"]}, periodSeconds: 1}')
    start_pod(kubelet_api, manifest, "probed")
    uid = kubelet_api.agent.pod("probed")["metadata"]["uid"]
    labels = dict(probe_type="Readiness", result="successful", container="main", pod=f"probed-{NODE}",
                  namespace="default", pod_uid=uid)
    wait_for(lambda: [s for s in scrape(kubelet_api, "/metrics/probes").get("prober_probe_total", [])
                      if s.labels == labels and s.value >= 2], 20, interval=0.5, what="two successful probes")


# -- the node's logs (/logs/) ------------------------------------------------------------------------------

def test_node_logs_listing_files_and_queries(kubelet_api):
    log_dir = kubelet_api.agent.workdir / "varlog"
    (log_dir / "edgelet-test-svc").mkdir(parents=True)
    (log_dir / "edgelet-test-svc" / "edgelet-test-svc.log").write_text("svc line 1\nsvc line 2\n")
    (log_dir / "messages").write_text("kernel: hello\n")
    token = {"Authorization": "Bearer stats-token"}  # allowed nodes/stats only
    refused = kubelet_api.get("/logs/", who=None, headers=token)
    assert refused.status_code == 403 and "subresource=log" in refused.text
    page = kubelet_api.get("/logs/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<a href="messages">messages</a>' in page.text and '<a href="edgelet-test-svc/">' in page.text
    assert kubelet_api.get("/logs/messages").text == "kernel: hello\n"
    assert kubelet_api.get("/logs/nothing").status_code == 404
    # A service journald has no unit of is read from its file; a query with a slash names a file.
    service = kubelet_api.get("/logs/?query=edgelet-test-svc")
    assert service.status_code == 200 and service.text == "svc line 1\nsvc line 2\n"
    assert kubelet_api.get("/logs/?query=/messages").text == "kernel: hello\n"
    bad = kubelet_api.get("/logs/?query=/messages&tailLines=3")
    assert bad.status_code == 400 and "cannot specify file with options" in bad.text
    assert kubelet_api.get("/logs/?query=/../../etc/passwd").status_code == 400


# A journal written with systemd-journal-remote from the export format: every field (the unit, the timestamps,
# the boot) is stored as given, so the queries below have one right answer on any machine, journald or not.
JOURNAL_REMOTE = ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")
JOURNAL_T0 = datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC)
PREVIOUS_BOOT = "00112233445566778899aabbccddeeff"
DEMO_LINES = [  # (seconds after JOURNAL_T0, unit, message); the first is of the boot before
    (-3600, "demo.service", "demo from the boot before"),
    (0, "demo.service", "demo starting"),
    (60, "demo.service", "demo ready"),
    (90, "other.service", "other unit line"),
    (120, "demo.service", "demo error: disk slow"),
    (180, "demo.service", "demo ERROR again"),
    (240, "demo.service", "demo stopping"),
]


def write_journal(directory: Path, lines: list[tuple[int, str, str]]) -> None:
    """A journal file in `directory` holding `lines`, the first of the boot before this one, the others of this
    boot (so `boot=0` means this boot whichever way journalctl resolves it)."""
    tool = next((path for path in JOURNAL_REMOTE if os.path.exists(path)), None)
    assert tool, "systemd-journal-remote is missing (Debian package systemd-journal-remote; `make deps` installs it)"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    entries = []
    for index, (seconds, unit, message) in enumerate(lines):
        at = JOURNAL_T0 + timedelta(seconds=seconds)
        fields = {"__REALTIME_TIMESTAMP": int(at.timestamp()) * 1_000_000, "__MONOTONIC_TIMESTAMP": 1_000_000 + index,
                  "_BOOT_ID": PREVIOUS_BOOT if index == 0 else boot, "_HOSTNAME": NODE, "_PID": 42,
                  "_SYSTEMD_UNIT": unit, "SYSLOG_IDENTIFIER": unit.removesuffix(".service"), "PRIORITY": 6,
                  "MESSAGE": message}
        entries.append("".join(f"{key}={value}\n" for key, value in fields.items()))
    directory.mkdir(parents=True, exist_ok=True)
    export = "".join(entry + "\n" for entry in entries).encode()  # a blank line ends each entry
    subprocess.run([tool, f"--output={directory / 'demo.journal'}", "-"], input=export, check=True,
                   capture_output=True, timeout=30)


def journal_messages(text: str) -> list[str]:
    """The messages of journalctl's short-precise output (`<time> <host> <identifier>[<pid>]: <message>`)."""
    return [line.split("]: ", 1)[1] for line in text.splitlines() if "]: " in line]


def _rfc3339(seconds: int) -> str:
    return (JOURNAL_T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_node_log_query_reads_a_units_journal(kubelet_api):
    write_journal(kubelet_api.agent.workdir / "journal", DEMO_LINES)
    token = {"Authorization": "Bearer stats-token"}  # allowed nodes/stats only
    refused = kubelet_api.get("/logs/?query=demo", who=None, headers=token)
    assert refused.status_code == 403 and "subresource=log" in refused.text

    def query(**parameters) -> list[str]:
        answer = kubelet_api.get("/logs/?" + urlencode({"query": "demo", **parameters}, doseq=True))
        assert answer.status_code == 200, answer.text
        return journal_messages(answer.text)

    everything = kubelet_api.get("/logs/?query=demo")
    demo = [message for _, unit, message in DEMO_LINES if unit == "demo.service"]
    assert journal_messages(everything.text) == demo  # the unit's lines alone, in order
    first = everything.text.splitlines()[0]
    assert first.startswith("Jan 02 02:00:00.000000 ") and f" {NODE} demo[42]: " in first  # UTC, microseconds
    assert query(sinceTime=_rfc3339(30), untilTime=_rfc3339(200)) == [
        "demo ready", "demo error: disk slow", "demo ERROR again"]
    assert query(tailLines=2) == ["demo ERROR again", "demo stopping"]
    assert query(pattern="error") == ["demo error: disk slow", "demo ERROR again"]  # case-insensitive
    assert query(pattern="error", tailLines=1) == ["demo ERROR again"]
    assert query(sinceTime=_rfc3339(100), pattern="ready") == []
    assert query(boot=0) == demo[1:]
    assert query(boot=-1) == ["demo from the boot before"]
    both = kubelet_api.get("/logs/?query=demo&query=other&sinceTime=" + _rfc3339(30))
    assert journal_messages(both.text) == ["demo ready", "other unit line", "demo error: disk slow",
                                           "demo ERROR again", "demo stopping"]
    # A service the journal has no unit of is looked for under node_log_dir, which it is not in.
    assert kubelet_api.get("/logs/?query=absent").text == "\nlog not found for absent\n"
    bad = kubelet_api.get("/logs/?query=demo&sinceTime=yesterday")
    assert bad.status_code == 400 and "sinceTime" in bad.text
    assert "Traceback" not in kubelet_api.agent.log_text()
