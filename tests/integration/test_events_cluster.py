"""Cluster mode: the real agent posts its events to the API server double, and keeps the same events locally."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for
from tests.integration.cluster_harness import NODE, api_pod, cluster_agent, running_in_api

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(tmp_path, containerd, api):
    process = cluster_agent(tmp_path, containerd.endpoint, api)
    yield process
    process.close()


def reasons(api, kind: str, name: str) -> dict[str, dict]:
    return {e["reason"]: e for e in api.list("events", namespace="default")
            if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name}


def test_pod_and_node_events_reach_the_api_and_the_local_log(agent, api):
    agent.start()
    created = api.create("pods", api_pod("web"))
    wait_for(lambda: running_in_api(api, "web"), 30, what="web Running in the API")
    wait_for(lambda: {"Pulled", "Created", "Started"} <= set(reasons(api, "Pod", "web")), 10, interval=0.2,
             what="pod events in the API")
    started = reasons(api, "Pod", "web")["Started"]
    assert started["involvedObject"]["uid"] == created["metadata"]["uid"]
    assert started["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert started["source"] == {"component": "kubelet", "host": NODE}
    assert started["reportingComponent"] == "kubelet" and started["reportingInstance"] == NODE
    assert started["metadata"]["name"].startswith("web.")

    node_events = wait_for(lambda: (r := reasons(api, "Node", NODE)) and {"Starting", "NodeReady"} <= set(r) and r,
                           20, interval=0.2, what="node events")
    assert {"NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID"} <= set(node_events)
    assert node_events["NodeReady"]["message"] == f"Node {NODE} status is now: NodeReady"

    api.delete("pods", "web", "default", grace_period=1)
    wait_for(lambda: "Killing" in reasons(api, "Pod", "web"), 30, interval=0.2, what="Killing in the API")

    local = agent.cli("get", "events", "--for", "pod/web")
    assert local.returncode == 0
    for reason, event in reasons(api, "Pod", "web").items():
        assert reason in local.stdout and event["message"] in local.stdout
