"""The walking skeleton end to end: manifests in a directory become containers on a real containerd."""

from __future__ import annotations

import json
import time

import pytest

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, container_state, fails_first_run_pod, is_running
from tests.integration.cri_harness import SocketProxy, runtime_objects

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint)
    yield process
    process.close()


def test_manifest_becomes_running_pod_and_removal_removes_sandbox(agent, containerd):
    agent.start()
    started = time.monotonic()
    agent.write_manifest("hello.yaml", busybox_manifest("hello", "echo hello from edgelet; exec sleep 3600"))
    pod = wait_for(lambda: (p := agent.pod("hello")) and is_running(p) and p, 60, what="hello Running")
    elapsed = time.monotonic() - started

    uid = pod["metadata"]["uid"]
    assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"
    assert pod["metadata"]["annotations"]["kubernetes.io/config.hash"] == uid
    sandboxes, containers = runtime_objects(containerd.endpoint, uid)
    assert len(sandboxes) == 1 and sandboxes[0].state == pb.SANDBOX_READY
    assert sandboxes[0].labels[labels.POD_NAME] == "hello-testnode"
    assert sandboxes[0].labels[labels.POD_NAMESPACE] == "default"
    (container,) = containers
    assert container.labels[labels.CONTAINER_NAME] == "main"
    assert container.annotations[labels.CONTAINER_RESTART_COUNT] == "0"
    assert len(container.annotations[labels.CONTAINER_HASH]) == 16
    status = container_state(pod)
    assert status["containerID"] == f"containerd://{container.id}"
    assert status["ready"] is True and status["restartCount"] == 0
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["ContainersReady"] == "True"

    # Logs land in the kubelet's layout, in CRI format.
    log_file = agent.pod_logs_dir / f"default_hello-testnode_{uid}" / "main" / "0.log"
    line = wait_for(lambda: log_file.exists() and log_file.read_text(), 10, what="container log")
    assert " stdout F hello from edgelet" in line
    logs = agent.cli("logs", "hello")
    assert logs.returncode == 0 and logs.stdout == "hello from edgelet\n"

    print(f"manifest -> Running (as the CLI sees it): {elapsed * 1000:.0f} ms")

    (agent.manifest_dir / "hello.yaml").unlink()
    wait_for(lambda: not runtime_objects(containerd.endpoint, uid)[0], 60, what="sandbox removed")
    wait_for(lambda: agent.pod("hello") is None, 10, what="pod gone from `edgelet pods`")


def test_crashing_container_restarts_with_backoff(agent, containerd):
    agent.start()
    agent.write_manifest("crash.yaml", busybox_manifest("crash", "echo crashing; exit 3"))

    def restarted_three_times():
        pod = agent.pod("crash")
        return pod if pod and container_state(pod).get("restartCount", 0) >= 3 else None

    wait_for(restarted_three_times, 60, what="three restarts")
    # Back-off 1 s doubling to 4 s here: after three restarts the wait is past its initial 1 s.
    seen = wait_for(lambda: (p := agent.pod("crash")) and container_state(p)["state"].get("waiting") and p,
                    30, interval=0.02, what="CrashLoopBackOff")
    waiting = container_state(seen)["state"]["waiting"]
    assert waiting["reason"] == "CrashLoopBackOff"
    assert "back-off" in waiting["message"] and "container=main" in waiting["message"]
    last = container_state(seen)["lastState"]["terminated"]
    assert last["exitCode"] == 3 and last["reason"] == "Error"
    assert seen["status"]["phase"] == "Running"  # restartPolicy Always keeps it Running, as kubectl shows
    delay = int(waiting["message"].split("back-off ", 1)[1].split("s", 1)[0])
    assert delay in (2, 4), waiting["message"]


def test_bad_manifest_reported_once_and_others_keep_running(agent, containerd):
    agent.start()
    agent.write_manifest("good.yaml", busybox_manifest("good", "exec sleep 3600"))
    agent.write_manifest("bad.yaml", """\
        apiVersion: v1
        kind: Pod
        metadata:
          name: bad
        spec:
          containers:
            - name: main
        """)
    wait_for(lambda: is_running(agent.pod("good")), 60, what="good Running")
    wait_for(lambda: "bad.yaml" in agent.log_text(), 10, what="bad manifest reported")
    time.sleep(1.5)
    reports = [line for line in agent.log_text().splitlines() if "bad.yaml" in line]
    assert len(reports) == 1, reports
    assert "spec.containers[0].image" in reports[0]
    assert agent.pod("bad") is None
    assert agent.proc.poll() is None


def test_kill9_then_restart_adopts_running_containers(agent, containerd):
    agent.start()
    agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
    agent.write_manifest("flappy.yaml", fails_first_run_pod("flappy", "true", "exec sleep 3600"))
    steady = wait_for(lambda: (p := agent.pod("steady")) and is_running(p) and p, 60, what="steady Running")
    flappy = wait_for(lambda: (p := agent.pod("flappy")) and is_running(p)
                      and container_state(p)["restartCount"] == 1 and p, 60, what="flappy restarted once")
    before = {name: runtime_objects(containerd.endpoint, p["metadata"]["uid"])
              for name, p in (("steady", steady), ("flappy", flappy))}

    agent.kill9()
    agent.start()
    wait_for(lambda: "container runtime ready" in agent.log_text(), 60, what="agent restarted")
    time.sleep(3)  # a few relists and syncs: enough for any wrong restart to show

    for name, (sandboxes, containers) in before.items():
        uid = sandboxes[0].labels[labels.POD_UID]
        after_sandboxes, after_containers = runtime_objects(containerd.endpoint, uid)
        assert [s.id for s in after_sandboxes] == [s.id for s in sandboxes], f"{name}: a new sandbox"
        running_before = {c.id for c in containers if c.state == pb.CONTAINER_RUNNING}
        running_after = {c.id for c in after_containers if c.state == pb.CONTAINER_RUNNING}
        assert running_after == running_before, f"{name}: containers restarted"
    pod = agent.pod("flappy")
    assert container_state(pod)["restartCount"] == 1
    assert is_running(pod)


def test_pods_json_is_a_pod_list_and_survives_the_agent(agent, containerd):
    agent.start()
    agent.write_manifest("listed.yaml", busybox_manifest("listed", "exec sleep 3600"))
    wait_for(lambda: is_running(agent.pod("listed")), 60, what="listed Running")
    agent.stop()
    result = agent.cli("pods", "-o", "json")
    assert result.returncode == 0
    pod_list = json.loads(result.stdout)
    assert pod_list["kind"] == "PodList"
    (item,) = pod_list["items"]
    assert item["metadata"]["name"] == "listed-testnode"
    assert item["status"]["phase"] == "Running"
    assert {c["type"] for c in item["status"]["conditions"]} >= {
        "PodScheduled", "Initialized", "ContainersReady", "Ready"}
    table = agent.cli("pods", "-o", "wide")
    assert "listed-testnode" in table.stdout and "Running" in table.stdout and "1/1" in table.stdout


def test_unreachable_runtime_is_retried_and_recovered(tmp_path, containerd):
    proxy_path = str(tmp_path / "cri.sock")
    proxy = SocketProxy(proxy_path, containerd.socket)
    agent = AgentProcess(tmp_path, f"unix://{proxy_path}")
    agent.write_manifest("patient.yaml", busybox_manifest("patient", "exec sleep 3600"))
    try:
        agent.start()  # the runtime is not there yet
        wait_for(lambda: proxy_path in agent.log_text(), 15, what="a message naming the endpoint")
        assert agent.proc.poll() is None
        proxy.up()
        wait_for(lambda: is_running(agent.pod("patient")), 60, what="patient Running after the runtime came")
        proxy.down()
        time.sleep(3)
        assert agent.proc.poll() is None, "the agent died while the runtime was away"
        proxy.up()
        agent.write_manifest("late.yaml", busybox_manifest("late", "exec sleep 3600"))
        wait_for(lambda: is_running(agent.pod("late")), 60, what="late Running after recovery")
    finally:
        agent.close()
        proxy.down()
