"""Graceful node shutdown with real pods: the agent on the private containerd, joined to the real control plane,
holding a delay inhibitor from a logind stand-in on a private bus (the real logind is exercised under
systemd-nspawn by tests/package/test_shutdown_nspawn.py).

On PrepareForShutdown(true): the node turns NotReady, the regular (API) pod is stopped first within
grace_period - critical_pods_grace_period, the critical (static) pod after it within its own budget, both end
Failed/Terminated in the API and in the local status cache, and only then is the inhibitor released.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import condition, container_status, pod_phase, wait_pod
from tests.helpers import wait_for
from tests.logind_double import LogindDouble

pytestmark = pytest.mark.containerd

IMAGE = "docker.io/library/busybox:local"
GRACE, CRITICAL_GRACE = 8, 4
# Both pods ignore SIGTERM: only the budgets end them, which makes the budgets observable.
STUBBORN = "trap '' TERM; while true; do sleep 0.2; done"
SHUTDOWN_TOML = f"""
[shutdown]
grace_period = "{GRACE}s"
critical_pods_grace_period = "{CRITICAL_GRACE}s"
"""
MESSAGE = "Pod was terminated in response to imminent node shutdown."


def finished_at(pod: dict) -> float:
    stamp = container_status(pod)["state"]["terminated"]["finishedAt"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def logind(tmp_path: Path, monkeypatch):
    bus = tmp_path / "bus"
    bus.mkdir()
    with LogindDouble(bus) as double:
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", double.address)
        yield double


def test_pods_stop_in_priority_order_within_their_budgets(cluster_agent, control_plane, kubectl, logind):
    agent = cluster_agent(SHUTDOWN_TOML)
    node = control_plane.node
    wait_for(lambda: condition(kubectl.get("node", node, None) or {}, "Ready") == "True", 60, interval=0.3,
             what="node Ready")
    wait_for(lambda: logind.inhibitors, 30, interval=0.1, what="the agent to take the inhibitor")
    assert logind.inhibitors == [("shutdown", "edgelet", logind.inhibitors[0][2], "delay")]

    regular = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "regular"},
               "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                        "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", STUBBORN]}]}}
    kubectl.run("create", "-f", "-", input=json.dumps(regular))
    agent.write_manifest("critical.yaml", f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: critical, namespace: default}}
        spec:
          terminationGracePeriodSeconds: 30
          containers:
          - name: main
            image: {IMAGE}
            imagePullPolicy: Never
            command: ["sh", "-c", "{STUBBORN}"]
        """)
    mirror = f"critical-{node}"
    wait_pod(kubectl, "regular", lambda p: pod_phase(p) == "Running", 60)
    wait_pod(kubectl, mirror, lambda p: pod_phase(p) == "Running", 60)

    started = time.time()
    logind.prepare_for_shutdown(True)
    wait_for(lambda: "node is shutting down" in next(
        (c.get("message", "") for c in kubectl.get("node", node, None)["status"]["conditions"] if c["type"] == "Ready"),
        ""), 10, interval=0.2, what="the node NotReady with the shutdown message")
    wait_for(lambda: logind.released_at, GRACE + 10, interval=0.1, what="the inhibitor released")
    released = logind.released_at[0] - started

    stopped_regular = wait_pod(kubectl, "regular", lambda p: pod_phase(p) == "Failed", 10)
    stopped_critical = wait_pod(kubectl, mirror, lambda p: pod_phase(p) == "Failed", 10)
    for pod in (stopped_regular, stopped_critical):
        assert (pod["status"]["reason"], pod["status"]["message"]) == ("Terminated", MESSAGE)
    # Order and budgets: the regular pod ended by its budget (grace - critical part), the critical one after
    # it by its own; the lock went only after both, within the whole grace period (seconds in the API).
    regular_end, critical_end = finished_at(stopped_regular) - started, finished_at(stopped_critical) - started
    assert regular_end <= GRACE - CRITICAL_GRACE + 2, regular_end
    assert critical_end - regular_end >= CRITICAL_GRACE - 2, (regular_end, critical_end)
    assert critical_end <= released + 1 and released <= GRACE + 3, (critical_end, released)

    # The local status cache has the final statuses too (what `edgelet pods` shows offline).
    local = agent.pods()
    for name in ("regular", mirror):
        status = local[name]["status"]
        assert (status["phase"], status["reason"], status["message"]) == ("Failed", "Terminated", MESSAGE)
    assert agent.proc.poll() is None
