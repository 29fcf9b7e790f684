"""What the upstream node-conformance specs check of a pod's life, in the real agent (cluster mode, the API server
double, the private containerd): termination messages, a terminal phase only once the containers stopped,
readiness gates, refusals at admission, probe-level grace periods and readiness while a pod terminates."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for
from tests.integration.cluster_harness import api_get, api_pod, cluster_agent, main_status, running_container_ids

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(tmp_path, containerd, api):
    process = cluster_agent(tmp_path, containerd.endpoint, api).start()
    yield process
    process.close()


def pod_status(api, name: str) -> dict:
    return (api_get(api, "pods", name, "default") or {}).get("status") or {}


def terminated_pod(name: str, script: str, *, path: str = "/dev/termination-log", policy: str = "File",
                   user: int | None = None) -> dict:
    pod = api_pod(name, script)
    pod["spec"]["restartPolicy"] = "Never"
    container = pod["spec"]["containers"][0]
    container.update(terminationMessagePath=path, terminationMessagePolicy=policy)
    if user is not None:
        container["securityContext"] = {"runAsUser": user}
    return pod


# The "Container Runtime blackbox test on terminated container" specs: (pod, phase, message).
TERMINATION_MESSAGES = [
    (terminated_pod("msg-file", "echo -n DONE > /dev/termination-log", user=0), "Succeeded", "DONE"),
    (terminated_pod("msg-custom", "echo -n DONE > /dev/termination-custom-log", path="/dev/termination-custom-log",
                    user=10000), "Succeeded", "DONE"),
    (terminated_pod("msg-log", "echo -n DONE; false", policy="FallbackToLogsOnError"), "Failed", "DONE"),
    (terminated_pod("msg-quiet", "echo -n DONE; true", policy="FallbackToLogsOnError"), "Succeeded", ""),
    (terminated_pod("msg-file-wins", "echo -n OK > /dev/termination-log; echo DONE; true",
                    policy="FallbackToLogsOnError"), "Succeeded", "OK"),
]


def test_terminated_containers_report_their_termination_message(agent, api):
    for pod, _, _ in TERMINATION_MESSAGES:
        api.create("pods", pod)
    for pod, phase, message in TERMINATION_MESSAGES:
        name = pod["metadata"]["name"]
        wait_for(lambda name=name, phase=phase: pod_status(api, name).get("phase") == phase, 60, interval=0.2,
                 what=f"{name} {phase}")
        terminated = main_status(api_get(api, "pods", name, "default"))["state"]["terminated"]
        assert terminated.get("message", "") == message, name


def test_a_pod_past_its_deadline_shows_failed_only_once_its_container_stopped(agent, api, containerd):
    # PID 1 sleep ignores SIGTERM: the kill lasts the whole 4 s grace period, while the pod is Failed locally.
    pod = api_pod("bounded", "exec sleep 3600", grace=4)
    pod["spec"]["activeDeadlineSeconds"] = 2
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: agent.pods().get("bounded", {}).get("status", {}).get("phase") == "Failed", 30,
             what="Failed locally")
    assert pod_status(api, "bounded").get("phase") == "Running"
    assert running_container_ids(containerd.endpoint, uid)
    wait_for(lambda: pod_status(api, "bounded").get("phase") == "Failed", 30, interval=0.1, what="Failed in the API")
    assert not running_container_ids(containerd.endpoint, uid)
    status = pod_status(api, "bounded")
    assert status["reason"] == "DeadlineExceeded"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"


def conditions(api, name: str) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod_status(api, name).get("conditions") or []}


@pytest.mark.parametrize("probe", ["livenessProbe", "startupProbe"])
def test_a_container_killed_for_a_failed_probe_gets_the_probe_grace_period(agent, api, probe):
    # PID 1 sleep ignores SIGTERM: only the grace period's end stops it, and the pod's is 500 s.
    pod = api_pod("probed", "exec sleep 3600", grace=500)
    pod["spec"]["containers"][0][probe] = {"exec": {"command": ["false"]}, "periodSeconds": 1,
                                           "failureThreshold": 1, "terminationGracePeriodSeconds": 2}
    api.create("pods", pod)
    wait_for(lambda: main_status(api_get(api, "pods", "probed", "default")).get("restartCount", 0) >= 1, 30,
             interval=0.2, what="the container restarted within the probe's 2 s grace")


def test_a_pod_being_deleted_turns_unready_while_its_container_stops(agent, api, containerd):
    # On SIGTERM the container stops being ready at once, then takes 20 s to exit.
    script = "trap 'rm -f /tmp/ready; sleep 20; exit 0' TERM; touch /tmp/ready; while true; do sleep 1; done"
    pod = api_pod("draining", script, grace=30)
    pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1,
                                                      "failureThreshold": 1}
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: conditions(api, "draining").get("Ready") == "True", 30, interval=0.2, what="Ready")
    api.delete("pods", "draining", "default", grace_period=30)
    wait_for(lambda: conditions(api, "draining").get("Ready") == "False", 10, interval=0.2, what="not Ready")
    assert running_container_ids(containerd.endpoint, uid)  # still stopping


def test_readiness_gates_set_by_others_decide_readiness(agent, api):
    pod = api_pod("gated")
    pod["spec"]["readinessGates"] = [{"conditionType": "k8s.io/test-condition1"},
                                     {"conditionType": "k8s.io/test-condition2"}]
    api.create("pods", pod)
    wait_for(lambda: pod_status(api, "gated").get("phase") == "Running", 30, interval=0.2, what="Running")

    def set_gate(kind: str, value: str) -> None:
        api.patch("pods", "gated", {"status": {"conditions": [{"type": kind, "status": value}]}}, namespace="default",
                  subresource="status")

    assert conditions(api, "gated").get("Ready") == "False"
    set_gate("k8s.io/test-condition1", "True")
    wait_for(lambda: "test-condition2" in next(c.get("message", "") for c in pod_status(api, "gated")["conditions"]
                                               if c["type"] == "Ready"), 10, interval=0.2, what="one gate left")
    assert conditions(api, "gated").get("Ready") == "False"
    set_gate("k8s.io/test-condition2", "True")
    wait_for(lambda: conditions(api, "gated").get("Ready") == "True", 10, interval=0.2, what="Ready")
    set_gate("k8s.io/test-condition1", "False")
    wait_for(lambda: conditions(api, "gated").get("Ready") == "False", 10, interval=0.2, what="not Ready again")
    # The conditions others own stay as they set them.
    assert conditions(api, "gated")["k8s.io/test-condition2"] == "True"


def test_a_pod_for_another_os_is_refused(agent, api, containerd):
    pod = api_pod("wrong-os")
    pod["spec"]["os"] = {"name": "windows"}
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: pod_status(api, "wrong-os").get("phase") == "Failed", 30, interval=0.2, what="refused")
    status = pod_status(api, "wrong-os")
    assert (status["reason"], status["message"]) == (
        "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    assert not running_container_ids(containerd.endpoint, uid)


def test_a_hostname_override_is_the_pods_hostname(agent, api):
    pod = terminated_pod("renamed", "echo -n $(hostname)';'$(hostname -f)';' > /dev/termination-log")
    pod["spec"].update(hostNetwork=False, hostname="custom-host", subdomain="t", hostnameOverride="override-host")
    api.create("pods", pod)
    wait_for(lambda: pod_status(api, "renamed").get("phase") == "Succeeded", 60, interval=0.2, what="Succeeded")
    terminated = main_status(api_get(api, "pods", "renamed", "default"))["state"]["terminated"]
    assert terminated["message"] == "override-host;override-host;"


# An httpd on 8080 whose CGI /cgi-bin/mark appends its query to /hits/log (a hostPath the test reads), the
# upstream hook specs' netexec in a few lines; every container leaves at once on SIGTERM.
LEAVE_ON_TERM = "trap 'exit 0' TERM; while true; do sleep 0.2; done"
MARKING_SERVER = (
    "mkdir -p /tmp/www/cgi-bin && printf '#!/bin/sh\\necho \"$QUERY_STRING\" >> /hits/log\\n"
    "printf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nok\"\\n' > /tmp/www/cgi-bin/mark"
    " && chmod +x /tmp/www/cgi-bin/mark && httpd -p 8080 -h /tmp/www; " + LEAVE_ON_TERM
)


def test_hooks_of_containers_and_sidecars_reach_the_pod(agent, api, tmp_path):
    hits = tmp_path / "hits"
    hits.mkdir()

    def mark(what: str) -> dict:
        return {"httpGet": {"path": f"/cgi-bin/mark?{what}", "port": 8080}}  # no host: the pod's own IP

    pod = api_pod("hooked", LEAVE_ON_TERM, volumes=[{"name": "hits", "hostPath": {"path": str(hits)}}], grace=15)
    spec = pod["spec"]
    spec["hostNetwork"] = False
    main = spec["containers"][0]
    main["volumeMounts"] = [{"name": "hits", "mountPath": "/hits"}]
    main["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", "echo main-poststart >> /hits/log"]}},
                         "preStop": mark("main-prestop")}
    server = {**main, "name": "server", "command": ["sh", "-c", MARKING_SERVER], "restartPolicy": "Always",
              "startupProbe": {**mark("startup"), "periodSeconds": 1}}
    del server["lifecycle"]
    hooked = {**main, "name": "hooked-sidecar", "restartPolicy": "Always",
              "lifecycle": {"postStart": mark("sidecar-poststart"), "preStop": mark("sidecar-prestop")}}
    spec["initContainers"] = [server, hooked]
    api.create("pods", pod)
    log = hits / "log"
    wait_for(lambda: log.exists() and {"sidecar-poststart", "main-poststart"} <= set(log.read_text().split()), 60,
             interval=0.2, what="both postStart hooks")
    api.delete("pods", "hooked", "default", grace_period=15)
    wait_for(lambda: api_get(api, "pods", "hooked", "default") is None, 30, interval=0.2, what="the pod gone")
    lines = [line for line in log.read_text().split() if line != "startup"]
    # The sidecar's postStart ran before the app started. PreStop hooks all start with the pod's termination, as
    # in the kubelet (only the stops are ordered): both reached the first sidecar, which outlives the others.
    assert lines[:2] == ["sidecar-poststart", "main-poststart"]
    assert sorted(lines[2:]) == ["main-prestop", "sidecar-prestop"]
