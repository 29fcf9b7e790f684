"""The pod lifecycle in the real agent (cluster mode, the API server double, the private containerd): a pod
refused at admission or finished by its restart policy never starts again, a shorter grace period cuts a kill
short, and activeDeadlineSeconds fails the pod."""

from __future__ import annotations

import time

import pytest

from edgelet.cri import runtime_v1_pb2 as pb
from tests.helpers import wait_for
from tests.integration.cluster_harness import api_get, api_pod, cluster_agent, running_in_api
from tests.integration.cri_harness import runtime_objects

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# Several sync ticks and PLEG relists: long enough for an agent that would act on an update to have acted.
SETTLE = 4.0


@pytest.fixture
def make_agent(tmp_path, containerd, api):
    agents = []

    def make(top_level: str = ""):
        agent = cluster_agent(tmp_path, containerd.endpoint, api)
        if top_level:  # top-level settings go before the first [section]
            text = agent.config_path.read_text()
            agent.config_path.write_text(top_level + "\n" + text)
        agents.append(agent)
        return agent.start()

    yield make
    for agent in agents:
        agent.close()


def phase_and_reason(api, name: str) -> tuple[str, str]:
    status = (api_get(api, "pods", name, "default") or {}).get("status") or {}
    return status.get("phase", ""), status.get("reason", "")


def relabel(api, name: str, value: str) -> None:
    """What `kubectl label` does: the agent gets an UPDATE of the same uid."""
    api.patch("pods", name, {"metadata": {"labels": {"touched": value}}}, namespace="default")


def test_a_pod_refused_at_admission_is_not_started_by_an_update(make_agent, api, containerd):
    make_agent("max_pods = 1")
    api.create("pods", api_pod("first"))
    wait_for(lambda: running_in_api(api, "first"), 30, what="first Running")
    refused = api.create("pods", api_pod("second"))["metadata"]["uid"]
    wait_for(lambda: phase_and_reason(api, "second") == ("Failed", "OutOfpods"), 30, what="second refused")
    relabel(api, "second", "1")
    relabel(api, "second", "2")
    time.sleep(SETTLE)
    assert runtime_objects(containerd.endpoint, refused) == ([], [])
    assert phase_and_reason(api, "second") == ("Failed", "OutOfpods")


def test_a_pod_finished_by_its_restart_policy_is_stopped_and_never_started_again(make_agent, api, containerd):
    make_agent()
    pod = api_pod("once", "exit 0")
    pod["spec"]["restartPolicy"] = "Never"
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: phase_and_reason(api, "once")[0] == "Succeeded", 30, what="once Succeeded")
    # The kubelet stops a terminal pod's sandbox: nothing of it runs any more.
    wait_for(lambda: [s.state for s in runtime_objects(containerd.endpoint, uid)[0]] == [pb.SANDBOX_NOTREADY], 30,
             what="the sandbox stopped")
    relabel(api, "once", "1")
    time.sleep(SETTLE)
    sandboxes, containers = runtime_objects(containerd.endpoint, uid)
    assert [s.state for s in sandboxes] == [pb.SANDBOX_NOTREADY] and len(containers) == 1
    assert phase_and_reason(api, "once")[0] == "Succeeded"


def test_a_shorter_grace_period_cuts_the_kill_under_way_short(make_agent, api, containerd):
    agent = make_agent()
    # PID 1 sleep ignores SIGTERM: only the grace period's end (SIGKILL) stops it.
    uid = api.create("pods", api_pod("slow", "exec sleep 3600", grace=120))["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "slow"), 30, what="slow Running")
    api.delete("pods", "slow", "default", grace_period=120)
    wait_for(lambda: "with 120s grace" in agent.log_text(), 30, what="the kill with 120 s grace")
    api.delete("pods", "slow", "default", grace_period=1)
    # Well before the first grace period could end: the container is killed within the new one.
    wait_for(lambda: not [c for c in runtime_objects(containerd.endpoint, uid)[1] if c.state == pb.CONTAINER_RUNNING],
             60, interval=0.5, what="the container killed within the shorter grace period")
    wait_for(lambda: api_get(api, "pods", "slow", "default") is None, 30, what="the final delete")


def test_a_pod_past_its_active_deadline_fails_and_its_containers_are_killed(make_agent, api, containerd):
    make_agent()
    pod = api_pod("bounded", "exec sleep 3600")
    pod["spec"]["activeDeadlineSeconds"] = 3
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "bounded"), 30, what="bounded Running")
    wait_for(lambda: phase_and_reason(api, "bounded") == ("Failed", "DeadlineExceeded"), 30, what="DeadlineExceeded")
    wait_for(lambda: not [c for c in runtime_objects(containerd.endpoint, uid)[1] if c.state == pb.CONTAINER_RUNNING],
             30, what="its container killed")
    events = [e for e in api.list("events", namespace="default")
              if e["involvedObject"].get("name") == "bounded" and e["reason"] == "DeadlineExceeded"]
    assert len(events) == 1 and events[0]["type"] == "Normal"
    assert "longer than the specified deadline" in events[0]["message"]
    relabel(api, "bounded", "1")
    time.sleep(SETTLE)
    assert not [c for c in runtime_objects(containerd.endpoint, uid)[1] if c.state == pb.CONTAINER_RUNNING]
