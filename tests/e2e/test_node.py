"""The node against a real kube-apiserver: registration, Ready, the Lease heartbeat and the NodeStatus it reports."""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.conftest import LEASE_DURATION_S, condition
from tests.helpers import wait_for

pytestmark = pytest.mark.containerd


def test_node_registers_ready_with_lease_and_status(cluster_agent, control_plane, kubectl):
    agent = cluster_agent()
    node = control_plane.node

    ready = wait_for(lambda: (lambda n: n if n and condition(n, "Ready") == "True" else None)(
        kubectl.get("node", node, None)), 60, interval=0.3, what="node Ready")

    labels = ready["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == node
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] in {"amd64", "arm64", "arm"}
    status = ready["status"]
    assert {"type": "Hostname", "address": node} in status["addresses"]
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert int(status["allocatable"]["pods"]) > 0
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        assert condition(ready, kind) == "False", kind
    # `kubectl get nodes` shows the node Ready, as for a kubelet.
    assert re.search(rf"^{re.escape(node)}\s+Ready\s", kubectl("get", "nodes"), re.MULTILINE)

    lease = kubectl.get("lease", node, "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == node
    assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION_S
    # Owned by the Node (deleting the Node deletes its Lease); set on a renewal once the Node's uid is known.
    lease = wait_for(lambda: (lambda got: got if got["metadata"].get("ownerReferences") else None)(
        kubectl.get("lease", node, "kube-node-lease")), LEASE_DURATION_S, interval=0.3, what="the Lease's owner")
    owner = lease["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, ready["metadata"]["uid"])
    first_renewal = lease["spec"]["renewTime"]
    wait_for(lambda: kubectl.get("lease", node, "kube-node-lease")["spec"]["renewTime"] != first_renewal,
             LEASE_DURATION_S, interval=0.3, what="a Lease renewal")
    assert agent.proc.poll() is None


def test_node_goes_unknown_when_its_lease_lapses_and_ready_on_reconnect(cluster_agent, control_plane, kubectl):
    """kube-controller-manager's node lifecycle controller judges the node by its Lease, as for a kubelet."""
    agent = cluster_agent()
    node = control_plane.node
    wait_for(lambda: condition(kubectl.get("node", node, None) or {}, "Ready") == "True", 60, interval=0.3,
             what="node Ready")

    agent.kill9()  # no goodbye: the Lease just stops being renewed
    stopped = time.monotonic()
    wait_for(lambda: condition(kubectl.get("node", node, None), "Ready") == "Unknown", 60, interval=0.5,
             what="the controller to mark the node Unknown")
    lapsed_after = time.monotonic() - stopped
    taints = {t["key"] for t in kubectl.get("node", node, None)["spec"].get("taints", [])}
    assert "node.kubernetes.io/unreachable" in taints

    agent.start()
    wait_for(lambda: condition(kubectl.get("node", node, None), "Ready") == "True", 60, interval=0.5,
             what="the node Ready again")
    print(f"node Unknown {lapsed_after:.1f}s after its agent died")
