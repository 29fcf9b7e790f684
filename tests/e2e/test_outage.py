"""The node through control-plane outages: an apiserver restart (fresh watch cache, 410 on resume), a 60 s
outage, and a device offline long enough for taint-based eviction to delete its pods.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import pytest

from tests.e2e.conftest import (NODE_MONITOR_GRACE, TOLERATION_SECONDS, Kubectl, condition, container_status, pod_phase,
                               wait_pod)
from tests.e2e.test_pods import pod_manifest
from tests.integration.agent_harness import wait_for

pytestmark = pytest.mark.containerd


def running_container_id(pod: dict) -> str:
    status = container_status(pod)
    return status.get("containerID", "") if "running" in (status.get("state") or {}) else ""


def test_apiserver_restart_and_a_60s_outage(node_ready, control_plane, kubectl, audit):
    node = control_plane.node
    kubectl.apply(pod_manifest("steady", node, "exec sleep 3600"))
    steady = wait_pod(kubectl, "steady", running_container_id, 60)
    container_id = running_container_id(steady)

    # A restart: the watch resumes from a resourceVersion the new watch cache does not know (410 -> re-list).
    # A write the pod watch does not see makes sure its last resourceVersion predates the new cache.
    kubectl("create", "configmap", "bump-resource-version")
    control_plane.stop_apiserver()
    restarted = time.time()
    control_plane.start_apiserver()
    kubectl.apply(pod_manifest("after-restart", node, "exec sleep 3600"))
    wait_pod(kubectl, "after-restart", running_container_id, 60)
    relists = [e for e in audit.events(user=f"system:node:{node}", since=restarted)
               if e.get("verb") == "list" and e.get("objectRef", {}).get("resource") == "pods"]
    assert relists, "the agent did not re-list its pods after the apiserver restart"
    kubectl("delete", "configmap", "bump-resource-version")

    # A 60 s outage: local pods run on; when the API is back the Lease and the pod watch resume.
    lease_before = kubectl.get("lease", node, "kube-node-lease")["spec"]["renewTime"]
    control_plane.stop_apiserver()
    time.sleep(60)
    assert node_ready.proc.poll() is None, "the agent died during the outage"
    control_plane.start_apiserver()
    restored = time.monotonic()
    wait_for(lambda: kubectl.get("lease", node, "kube-node-lease")["spec"]["renewTime"] != lease_before, 40,
             interval=0.2, what="the Lease renewed after the outage")
    lease_back = time.monotonic() - restored
    kubectl.apply(pod_manifest("after-outage", node, "exec sleep 3600"))
    # The pod watch retries as client-go's reflector does: after a minute down its step is 30 s and each wait
    # up to twice that. The Lease's first renewal after the failures ends that wait within one renew interval.
    wait_pod(kubectl, "after-outage", running_container_id, 120)
    watch_back = time.monotonic() - restored
    # A retry made while the apiserver starts is answered once it serves: the watch may be back with the Lease.
    # When the Lease came back first, its renewal is what ended the watch's wait.
    log = node_ready.log_text()
    lease_line = log.rindex("renewing the node lease: working again")
    source_line = log.rindex("API pod source: working again")
    if source_line > lease_line:
        assert "API pod source: the API server answers again; watching again within" in log[lease_line:source_line]

    # The pod that ran through both was never restarted.
    steady = kubectl.get("pod", "steady")
    assert running_container_id(steady) == container_id
    assert container_status(steady)["restartCount"] == 0
    assert condition(kubectl.get("node", node, None), "Ready") == "True"
    print(f"after a 60s outage: Lease renewed {lease_back:.1f}s, new pod running {watch_back:.1f}s after restore "
          "(goal: 12 s)")


class AnchorNode:
    """A second node that stays healthy (its Lease renewed by this thread), so the node lifecycle controller
    is not in full-disruption mode (where it evicts nothing) when the node under test goes away."""

    def __init__(self, kubectl, name: str = "anchor"):
        self.kubectl = kubectl
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def __enter__(self):
        now = _rfc3339()
        self.kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name}}), "")
        # `patch --subresource` came with kubectl 1.24: the current client writes the status.
        Kubectl(self.kubectl.kubeconfig, "1.36")(
            "patch", "node", self.name, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))
        self.kubectl.apply(json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                       "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                                       "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40,
                                                "renewTime": _rfc3339(micro=True)}}), "kube-node-lease")
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(2):
            self.kubectl.run("patch", "lease", self.name, "-n", "kube-node-lease", "--type=merge", "-p",
                             json.dumps({"spec": {"renewTime": _rfc3339(micro=True)}}), check=False)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.kubectl.run("delete", "node", self.name, "--wait=false", check=False)
        self.kubectl.run("delete", "lease", self.name, "-n", "kube-node-lease", check=False)


def _rfc3339(micro: bool = False) -> str:
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def test_long_offline_pods_evicted_unless_they_tolerate_unreachable(node_ready, control_plane, kubectl):
    """What the kubelet does, edgelet does: the API is the truth once it is reachable again. A pod deleted by
    taint-based eviction while the device was offline is stopped on reconnect; a pod that tolerates
    node.kubernetes.io/unreachable forever (or a static pod) keeps running throughout (docs/cluster.md)."""
    node = control_plane.node
    forever = {"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                "effect": "NoExecute"},
                               {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                "effect": "NoExecute"}]}
    with AnchorNode(kubectl):
        kubectl.apply(pod_manifest("evictable", node, "exec sleep 3600"))
        kubectl.apply(pod_manifest("kept", node, "exec sleep 3600", extra_spec=forever))
        wait_pod(kubectl, "evictable", running_container_id, 60)
        kept = wait_pod(kubectl, "kept", running_container_id, 60)

        node_ready.kill9()  # the device drops off the network; its containers keep running
        went = time.monotonic()
        wait_pod(kubectl, "evictable", lambda p: p["metadata"].get("deletionTimestamp"),
                 60 + TOLERATION_SECONDS)
        evicted_after = time.monotonic() - went

        node_ready.start()  # back online: the deleted pod is stopped and gone, the tolerant one untouched
        wait_for(lambda: kubectl.get("pod", "evictable") is None, 60, interval=0.5,
                 what="the evicted pod stopped and removed")
        wait_for(lambda: condition(kubectl.get("node", node, None), "Ready") == "True", 60, interval=0.5,
                 what="node Ready again")
        still = kubectl.get("pod", "kept")
        assert running_container_id(still) == running_container_id(kept)
        assert pod_phase(still) == "Running"
    print(f"pod deleted by taint-based eviction {evicted_after:.1f}s after the node went away "
          f"(test timings: node-monitor-grace {NODE_MONITOR_GRACE}, toleration {TOLERATION_SECONDS}s)")
