"""Events against a real kube-apiserver: `kubectl describe pod` shows the events of a pod's life, repeats are
counted on one event (the server applies our PATCHes), and `kubectl get events` lists the node's events."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import condition, pod_phase, wait_pod
from tests.helpers import wait_for

pytestmark = pytest.mark.containerd

IMAGE = "docker.io/library/busybox:local"


def pod_manifest(name: str, node: str, command: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", command]}]},
    })


def events_of(kubectl, kind: str, name: str) -> list[dict]:
    listed = kubectl.json("get", "events", "-n", "default",
                          "--field-selector", f"involvedObject.kind={kind},involvedObject.name={name}")
    return listed["items"]


def describe_events(text: str) -> list[list[str]]:
    """The rows of the Events table of `kubectl describe`: [type, reason, age..., from, message...]."""
    section = text[text.index("\nEvents:") + 1:].splitlines()[3:]
    return [line.split() for line in section if line.strip()]


def wait_node_ready(kubectl, node: str) -> None:
    wait_for(lambda: condition(kubectl.get("node", node, None) or {}, "Ready") == "True", 60, interval=0.3,
             what="node Ready")


def test_kubectl_describe_pod_shows_the_events_of_its_life(cluster_agent, control_plane, kubectl):
    cluster_agent()
    node = control_plane.node
    wait_node_ready(kubectl, node)
    kubectl.apply(pod_manifest("lifecycle", node, "exec sleep 3600"))
    pod = wait_pod(kubectl, "lifecycle", lambda p: pod_phase(p) == "Running")

    wanted = ["Pulled", "Created", "Started"]
    text = wait_for(lambda: (t := kubectl("describe", "pod", "lifecycle")) and "\nEvents:\n" in t
                    and all(r in t for r in wanted) and t, 30, interval=0.5, what="events in kubectl describe")
    rows = describe_events(text)
    assert [row[1] for row in rows if row[1] in wanted] == wanted
    for row in rows:
        assert row[0] == "Normal" and "kubelet" in row, row
    assert any(" ".join(row).endswith(f'Container image "{IMAGE}" already present on machine') for row in rows)
    assert any(" ".join(row).endswith("Started container main") for row in rows)

    started = next(e for e in events_of(kubectl, "Pod", "lifecycle") if e["reason"] == "Started")
    assert started["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert started["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert started["source"] == {"component": "kubelet", "host": node}

    kubectl("delete", "pod", "lifecycle", "--wait=false")
    wait_for(lambda: any(e["reason"] == "Killing" and e["message"] == "Stopping container main"
                         for e in events_of(kubectl, "Pod", "lifecycle")), 30, interval=0.5, what="Killing event")


def test_a_crash_loop_is_counted_on_one_event(cluster_agent, control_plane, kubectl):
    cluster_agent()
    node = control_plane.node
    wait_node_ready(kubectl, node)
    kubectl.apply(pod_manifest("crasher", node, "exit 1"))

    def repeated():
        events = {e["reason"]: e for e in events_of(kubectl, "Pod", "crasher")}
        return "BackOff" in events and events.get("Started", {}).get("count", 0) >= 2 and events

    events = wait_for(repeated, 90, interval=0.5, what="repeated Started and a BackOff event")
    assert events["BackOff"]["type"] == "Warning"
    assert events["BackOff"]["message"] == "Back-off restarting failed container"
    started = events["Started"]
    assert started["lastTimestamp"] >= started["firstTimestamp"]
    # One Event object per repeated event, as with a kubelet.
    assert sum(1 for e in events_of(kubectl, "Pod", "crasher") if e["reason"] == "Started") == 1
    text = kubectl("describe", "pod", "crasher")
    assert any(row[1] == "Started" and row[3].startswith("(x") for row in describe_events(text))


def test_kubectl_get_events_lists_the_node_events(cluster_agent, control_plane, kubectl):
    cluster_agent()
    node = control_plane.node
    wait_node_ready(kubectl, node)
    wanted = {"Starting", "NodeReady", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID"}
    wait_for(lambda: wanted <= {e["reason"] for e in events_of(kubectl, "Node", node)}, 30, interval=0.5,
             what="node events")
    table = kubectl("get", "events", "-n", "default").splitlines()
    rows = [line.split(None, 4) for line in table[1:]]
    assert {row[2] for row in rows if row[3] == f"node/{node}"} >= {"Starting", "NodeReady"}
    ready = next(row for row in rows if row[3] == f"node/{node}" and row[2] == "NodeReady")
    assert ready[4] == f"Node {node} status is now: NodeReady"
