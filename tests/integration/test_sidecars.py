"""Native sidecars (init containers with restartPolicy Always) through the real agent on containerd:
start order, the startup probe gate, restarts whatever the pod's policy, stop order and a pod that Succeeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import container_state

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

IMAGE = "docker.io/library/busybox:local"


def init_state(pod: dict, name: str) -> dict:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status["name"] == name:
            return status
    return {}


def sidecar_script(name: str, before: str = "") -> str:
    """Records its start and its stop (on SIGTERM) in /shared/order."""
    return (f"{before}echo {name}-start >> /shared/order; "
            f"trap 'echo {name}-stop >> /shared/order; exit 0' TERM; while true; do sleep 0.1; done")


def container(name: str, script: str, extra: str = "", indent: str = "            ") -> str:
    lines = [f"- name: {name}", f"  image: {IMAGE}", "  imagePullPolicy: Never",
             f"  command: [\"sh\", \"-c\", {json.dumps(script)}]",
             "  volumeMounts:", "    - name: shared", "      mountPath: /shared"]
    lines += [line for line in extra.splitlines() if line.strip()]
    return "\n".join(indent + line for line in lines)


def pod_manifest(name: str, shared: Path, init: list[str], containers: list[str], policy: str, grace: int = 10) -> str:
    return "\n".join([
        "apiVersion: v1", "kind: Pod", "metadata:", f"  name: {name}", "spec:", "  hostNetwork: true",
        f"  restartPolicy: {policy}", f"  terminationGracePeriodSeconds: {grace}",
        "  volumes:", "    - name: shared", "      hostPath:", f"        path: {shared}",
        "        type: DirectoryOrCreate",
        "  initContainers:", *init, "  containers:", *containers, "",
    ])


def test_sidecars_start_in_order_outlive_the_app_and_the_pod_succeeds(agent, tmp_path):
    shared = tmp_path / "shared"
    always = "  restartPolicy: Always"
    init = [
        container("setup", "echo setup >> /shared/order", indent="    "),
        container("log", sidecar_script("log"), always, indent="    "),
        # Runs only once the sidecar before it has started: it fails (and the pod with it) otherwise.
        container("after", "grep -q log-start /shared/order && echo after >> /shared/order", indent="    "),
        # Started only when its startup probe passes, a second after it runs; the app waits for that. A restart
        # shows as a second proxy-start (the first instance, killed in `sleep 1`, writes no proxy-stop: PID 1
        # ignores SIGTERM until its trap is set). The failure threshold is generous because on a loaded machine
        # an exec probe can outlast its 1 s timeout; a startup probe result recorded before the container ran
        # restarts it whatever the threshold (a bug once, seen in CI).
        container("proxy", sidecar_script("proxy", before="sleep 1; touch /shared/proxy-up; "),
                  always + "\n  startupProbe:\n    exec:\n      command: [\"test\", \"-f\", \"/shared/proxy-up\"]\n"
                  "    periodSeconds: 1\n    failureThreshold: 30", indent="    "),
    ]
    main = [container("main", "grep -q proxy-start /shared/order && echo main >> /shared/order", indent="    ")]
    agent.write_manifest("sidecars.yaml", pod_manifest("sidecars", shared, init, main, "Never"))

    pod = wait_for(lambda: (p := agent.pod("sidecars")) and p["status"].get("phase") in ("Succeeded", "Failed") and p,
                   120, interval=0.5, what="a terminal phase")
    order = (shared / "order").read_text().split()
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], order)
    # Started in spec order, each after the one before it had started; stopped after the app, in reverse.
    assert order == ["setup", "log-start", "after", "proxy-start", "main", "proxy-stop", "log-stop"]
    assert container_state(pod, "main")["state"]["terminated"]["exitCode"] == 0
    for name in ("log", "proxy"):
        status = init_state(pod, name)
        assert status["state"]["terminated"]["exitCode"] == 0, status  # stopped by SIGTERM, not killed
        assert (status["restartCount"], status["ready"]) == (0, False)
    assert [s["name"] for s in pod["status"]["initContainerStatuses"]] == ["setup", "log", "after", "proxy"]


def test_sidecar_restarts_on_exit_under_never_and_counts_for_readiness(agent, tmp_path):
    shared = tmp_path / "shared"
    init = [container(
        "flaky", "echo run >> /shared/runs; if [ $(wc -l < /shared/runs) -lt 2 ]; then sleep 1; exit 3; fi; "
                 "exec sleep 3600",
        "  restartPolicy: Always\n  readinessProbe:\n    exec:\n      command: [\"test\", \"-f\", \"/shared/ready\"]\n"
        "    periodSeconds: 1", indent="    ")]
    main = [container("main", "exec sleep 3600", indent="    ")]
    agent.write_manifest("flaky.yaml", pod_manifest("flaky", shared, init, main, "Never", grace=1))

    def restarted_and_running(pod):
        status = init_state(pod or {}, "flaky")
        return status.get("restartCount", 0) >= 1 and "running" in status.get("state", {}) and pod

    pod = wait_for(lambda: restarted_and_running(agent.pod("flaky")), 90, interval=0.5,
                   what="the sidecar restarted under restartPolicy Never")
    sidecar = init_state(pod, "flaky")
    assert sidecar["lastState"]["terminated"]["exitCode"] == 3
    assert sidecar["started"] is True
    assert (shared / "runs").read_text().split() == ["run", "run"]
    assert pod["status"]["phase"] in ("Pending", "Running")
    # The app waited for the sidecar to run again; the sidecar's readiness holds the pod's Ready.
    pod = wait_for(lambda: (p := agent.pod("flaky")) and "running" in container_state(p, "main").get("state", {})
                   and p, 60, interval=0.5, what="main running")
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert "[flaky]" in conditions["ContainersReady"].get("message", "")
    (shared / "ready").touch()
    pod = wait_for(lambda: (p := agent.pod("flaky")) and {c["type"]: c["status"] for c in p["status"]["conditions"]}
                   .get("Ready") == "True" and p, 60, interval=0.5, what="Ready once the sidecar is")
    assert init_state(pod, "flaky")["ready"] is True
    assert container_state(pod, "main")["restartCount"] == 0


def test_api_pod_with_a_sidecar_succeeds_like_a_job(tmp_path, containerd):
    """1.20 drops restartPolicy from init containers, so the API path runs against the double (a current
    server's behaviour): the sidecar runs beside the app, shows started and ready, and the pod Succeeds."""
    from tests.integration.cluster_harness import NODE, api_pod, cluster_agent
    from tests.kubeapi_double import ApiServerDouble

    with ApiServerDouble(bookmark_interval=0.5, node_name=NODE) as api:
        agent = cluster_agent(tmp_path, containerd.endpoint, api)
        agent.start()
        try:
            job_pod = api_pod("job", "sleep 2; exit 0")
            job_pod["spec"]["restartPolicy"] = "Never"
            job_pod["spec"]["initContainers"] = [{
                "name": "proxy", "image": IMAGE, "imagePullPolicy": "Never", "restartPolicy": "Always",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"]}]
            api.create("pods", job_pod)

            def api_pod_now():
                return api.get("pods", "job", "default")

            running = wait_for(lambda: (p := api_pod_now()) and init_state(p, "proxy").get("started") and p, 60,
                               interval=0.2, what="the sidecar started in the API status")
            assert init_state(running, "proxy")["ready"] is True
            done = wait_for(lambda: (p := api_pod_now()) and p["status"].get("phase") in ("Succeeded", "Failed") and p,
                            60, interval=0.3, what="a terminal phase in the API")
            assert done["status"]["phase"] == "Succeeded", done["status"]
            assert init_state(done, "proxy")["state"]["terminated"]["exitCode"] == 0
            assert container_state(done, "main")["state"]["terminated"]["exitCode"] == 0
        finally:
            agent.stop()
