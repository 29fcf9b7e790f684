"""`edgelet describe pod` and `edgelet get events` print what kubectl prints: layout, ages, selection."""

from __future__ import annotations

import pytest

from edgelet.api.kubetime import format_time
from edgelet.cli.describe import (
    describe_pod,
    events_table,
    find_pod,
    human_duration,
    pod_events,
    select_events,
    tabwrite,
)
from edgelet.events import NORMAL, WARNING, node_ref, pod_ref
from edgelet.events.model import make_event

NOW = 1_790_000_000.0


@pytest.mark.parametrize("seconds, text", [
    (-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"), (600, "10m"),
    (179 * 60, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60 * 7, "3h7m"), (8 * 3600 + 59, "8h"), (47 * 3600, "47h"),
    (48 * 3600, "2d"), (50 * 3600, "2d2h"), (8 * 86400, "8d"), (729 * 86400, "729d"), (730 * 86400, "2y"),
    (731 * 86400, "2y1d"), (9 * 365 * 86400, "9y"),
])
def test_human_duration_as_apimachinery(seconds, text):
    assert human_duration(seconds) == text


@pytest.mark.parametrize("text, expected", [
    ("a:\tb\nlonger:\tc\n", "a:       b\nlonger:  c\n"),
    # A line without a tab ends the column block: the next block aligns on its own.
    ("a:\tb\nsection:\n  x:\ty\n  longer:\tz\n", "a:  b\nsection:\n  x:       y\n  longer:  z\n"),
    # Continuation lines (empty first cell) align with their block.
    ("Labels:\ta=1\n\tb=2\nIP:\t10.0.0.1\n", "Labels:  a=1\n         b=2\nIP:      10.0.0.1\n"),
    # Nested columns: the second column is aligned only across lines that have it.
    ("T\tR\tM\nNormal\tPulled\tok\n", "T       R       M\nNormal  Pulled  ok\n"),
])
def test_tabwriter_like_go(text, expected):
    assert tabwrite(text) == expected


POD = {
    "metadata": {"name": "web-edge-1", "namespace": "default", "uid": "u-1", "labels": {"app": "web", "tier": "a"},
                 "annotations": {"kubernetes.io/config.source": "file"}},
    "spec": {
        "nodeName": "edge-1",
        "containers": [{"name": "main", "image": "registry.local/web:1", "command": ["sh", "-c", "exit 1"],
                        "ports": [{"containerPort": 80}],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "web-conf"}}],
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
    },
    "status": {
        "phase": "Running", "hostIP": "10.0.0.5", "podIP": "10.88.0.7", "podIPs": [{"ip": "10.88.0.7"}],
        "startTime": format_time(NOW - 600), "qosClass": "BestEffort",
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{
            "name": "main", "ready": False, "restartCount": 3, "image": "registry.local/web:1",
            "imageID": "sha256:abc", "containerID": "containerd://0123",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": format_time(NOW - 60),
                                         "finishedAt": format_time(NOW - 59)}},
        }],
    },
}


def _event(ref, event_type, reason, message, *, first, last=None, count=1):
    event = make_event(ref, event_type, reason, message, host="edge-1", now=NOW - first)
    event["lastTimestamp"] = format_time(NOW - (last if last is not None else first))
    event["count"] = count
    return event


EVENTS = [
    _event(pod_ref(POD, "main"), NORMAL, "Pulled", 'Container image "registry.local/web:1" already present on machine',
           first=600, last=60, count=4),
    _event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container", first=300, last=5,
           count=7),
    _event(node_ref("edge-1"), NORMAL, "Starting", "Starting kubelet.", first=700),
    _event(pod_ref({"metadata": {"name": "db", "namespace": "data", "uid": "u-2"}}), WARNING, "Failed",
           "Error: ErrImagePull", first=30),
]


def test_describe_pod_reads_like_kubectl():
    text = describe_pod(POD, pod_events(EVENTS, POD), NOW)
    lines = text.splitlines()
    assert lines[0] == "Name:         web-edge-1"
    assert "Node:         edge-1/10.0.0.5" in lines
    assert "Labels:       app=web" in lines and "              tier=a" in lines
    assert "Annotations:  kubernetes.io/config.source: file" in lines
    assert "Status:       Running" in lines and "IP:           10.88.0.7" in lines
    assert "      sh" in lines and "      exit 1" in lines
    container = text[text.index("Containers:"):text.index("Conditions:")]
    assert "    State:          Waiting\n      Reason:       CrashLoopBackOff\n" in container
    assert "    Last State:     Terminated\n      Reason:       Error\n      Exit Code:    1\n" in container
    assert "    Ready:          False\n    Restart Count:  3\n" in container
    assert "    Port:          80/TCP\n    Host Port:     0/TCP\n" in container
    assert "      /scratch from scratch (rw)" in container
    assert "Conditions:\n  Type          Status\n  Initialized   True \n  Ready         False \n" in text
    assert "    Type:       EmptyDir (a temporary directory that shares a pod's lifetime)" in text
    assert "    Type:        ConfigMap (a volume populated by a ConfigMap)\n    Name:        web-conf\n" in text
    assert "QoS Class:       BestEffort" in text
    assert "Tolerations:     node.kubernetes.io/not-ready:NoExecute op=Exists for 300s" in text
    events = text[text.index("Events:"):].splitlines()
    assert events == [
        "Events:",
        "  Type     Reason   Age                From     Message",
        "  ----     ------   ----               ----     -------",
        '  Normal   Pulled   60s (x4 over 10m)  kubelet  '
        'Container image "registry.local/web:1" already present on machine',
        "  Warning  BackOff  5s (x7 over 5m)    kubelet  Back-off restarting failed container",
    ]


@pytest.mark.parametrize("change, expected", [
    ({"metadata": {"deletionTimestamp": format_time(NOW - 3), "deletionGracePeriodSeconds": 30}},
     "Status:                    Terminating (lasts 3s)"),
    ({"status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}},
     "Reason:       Evicted"),
    ({"status": {"phase": "Pending"}}, "Status:       Pending"),
    ({"metadata": {"labels": {}}}, "Labels:       <none>"),
    ({"spec": {"volumes": []}}, "Volumes:         <none>"),
])
def test_describe_pod_variants(change, expected):
    pod = {key: {**POD[key], **change.get(key, {})} for key in POD}
    assert expected in describe_pod(pod, [], NOW).splitlines()


def test_describe_lists_ephemeral_containers_after_the_containers():
    pod = {**POD, "spec": {**POD["spec"], "ephemeralContainers": [{"name": "debugger", "image": "busybox:1"}]},
           "status": {**POD["status"], "ephemeralContainerStatuses": [
               {"name": "debugger", "ready": False, "restartCount": 0, "state": {"running": {}}}]}}
    lines = describe_pod(pod, [], NOW).splitlines()
    assert lines.index("Ephemeral Containers:") > lines.index("Containers:")
    assert "  debugger:" in lines
    assert "Ephemeral Containers:" not in describe_pod(POD, [], NOW).splitlines()


def test_describe_without_events_says_none():
    assert describe_pod(POD, [], NOW).endswith("\nEvents:          <none>\n")


def test_pod_events_are_those_of_the_pod_itself():
    other_incarnation = _event(pod_ref({**POD, "metadata": {**POD["metadata"], "uid": "u-old"}}), NORMAL,
                               "Started", "Started container main", first=900)
    assert [e["reason"] for e in pod_events([*EVENTS, other_incarnation], POD)] == ["Pulled", "BackOff"]


def test_get_events_table():
    lines = events_table(select_events(EVENTS, namespace="default", for_object=None, node_name="edge-1"), NOW,
                         all_namespaces=False).splitlines()
    assert lines == [
        "LAST SEEN   TYPE      REASON     OBJECT           MESSAGE",
        "11m         Normal    Starting   node/edge-1      Starting kubelet.",
        '60s         Normal    Pulled     pod/web-edge-1   '
        'Container image "registry.local/web:1" already present on machine',
        "5s          Warning   BackOff    pod/web-edge-1   Back-off restarting failed container",
    ]


def test_get_events_all_namespaces_has_a_namespace_column():
    lines = events_table(EVENTS, NOW, all_namespaces=True).splitlines()
    assert lines[0].split() == ["NAMESPACE", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[-1].split()[:5] == ["default", "5s", "Warning", "BackOff", "pod/web-edge-1"]
    assert lines[3].split()[:5] == ["data", "30s", "Warning", "Failed", "pod/db"]


@pytest.mark.parametrize("namespace, for_object, reasons", [
    ("default", None, ["Pulled", "BackOff", "Starting"]),
    (None, None, ["Pulled", "BackOff", "Starting", "Failed"]),
    ("data", None, ["Failed"]),
    (None, "pod/web-edge-1", ["Pulled", "BackOff"]),
    (None, "pod/web", ["Pulled", "BackOff"]),  # a static pod by its short name
    (None, "pods/web", ["Pulled", "BackOff"]),
    (None, "web", ["Pulled", "BackOff"]),
    (None, "node/edge-1", ["Starting"]),
    (None, "pod/nothing", []),
])
def test_select_events(namespace, for_object, reasons):
    chosen = select_events(EVENTS, namespace=namespace, for_object=for_object, node_name="edge-1")
    assert [e["reason"] for e in chosen] == reasons


@pytest.mark.parametrize("namespace, name, found", [
    ("default", "web-edge-1", "web-edge-1"), ("default", "web", "web-edge-1"), ("other", "web", None),
    ("default", "db", None),
])
def test_find_pod(namespace, name, found):
    pod = find_pod([POD], namespace, name, "edge-1")
    assert (pod["metadata"]["name"] if pod else None) == found


def test_describe_node_shows_the_tunnel_as_recorded():
    from edgelet.cli.describe import describe_node

    tunnel = {"agentID": "edge-1", "agentIdentifiers": "host=edge-1&ipv4=10.0.0.5", "serverCount": 2,
              "streams": [{"address": "10.0.0.1:8132", "serverID": "srv-a", "connectedSince": NOW - 90,
                           "lastError": ""},
                          {"address": "10.0.0.2:8132", "serverID": "", "connectedSince": 0,
                           "lastError": "UNAVAILABLE: Connection refused"}],
              "connections": 3, "dialsRefused": 1}
    text = describe_node("edge-1", tunnel, [], NOW)
    lines = [line.split() for line in text.splitlines()]
    assert ["Name:", "edge-1"] in lines
    assert ["Agent", "Identifiers:", "host=edge-1&ipv4=10.0.0.5"] in lines
    assert ["Server", "Count:", "2"] in lines and ["Dials", "Refused:", "1"] in lines
    assert ["10.0.0.1:8132", "srv-a", "90s", "<none>"] in lines
    assert ["10.0.0.2:8132", "<none>", "no", "UNAVAILABLE:", "Connection", "refused"] in lines
    assert "Tunnel:\t<none>" not in text and "Tunnel:  <none>" in describe_node("edge-1", None, [], NOW)
