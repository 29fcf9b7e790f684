"""`edgelet simulate` against the real control plane: ten hollow nodes register and stay Ready on their Leases,
run API pods, and come back after an apiserver restart with renewed Leases and re-established pod watches.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import LEASE_DURATION_S, REPO, condition, pod_phase, wait_pod
from tests.e2e.harness import pod_manifest
from tests.helpers import wait_for

NODES = 10
PREFIX = "sim-"
USER = "edgelet-simulator"


@pytest.fixture
def simulator(control_plane, kubectl, tmp_path):
    """`edgelet simulate` with the e2e suite's short cluster timings; its nodes and pods are deleted afterwards."""
    kubeconfig = control_plane.kubeconfig_for("simulator", USER, "system:masters")
    out = open(tmp_path / "simulate.out", "wb")
    err = open(tmp_path / "simulate.err", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgelet", "simulate", "--nodes", str(NODES), "--kubeconfig", str(kubeconfig),
         "--name-prefix", PREFIX, "--start-rate", "50", "--report-interval", "1",
         "--lease-duration", str(LEASE_DURATION_S), "--lease-renew-interval", str(LEASE_DURATION_S / 4),
         "--node-status-update-frequency", "2", "--node-status-report-frequency", "10", "--status-resync", "2"],
        stdout=out, stderr=err, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    out.close()
    err.close()
    names = [f"{PREFIX}{index:04d}" for index in range(NODES)]
    kubectl.run("delete", "pods", "sim-before", "sim-after", "--grace-period=0", "--force", "--wait=false",
                "--ignore-not-found", check=False)
    kubectl.run("delete", "nodes", *names, "--wait=false", "--ignore-not-found", check=False)


def ready_nodes(kubectl) -> set[str]:
    nodes = kubectl.json("get", "nodes")["items"]
    return {n["metadata"]["name"] for n in nodes
            if n["metadata"]["name"].startswith(PREFIX) and condition(n, "Ready") == "True"}


def test_ten_hollow_nodes_run_pods_and_reconnect_after_an_apiserver_restart(simulator, control_plane, kubectl,
                                                                            audit, tmp_path):
    names = {f"{PREFIX}{index:04d}" for index in range(NODES)}
    wait_for(lambda: ready_nodes(kubectl) == names, 60, interval=0.5, what="ten hollow nodes Ready")
    node = kubectl.get("node", f"{PREFIX}0003", None)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("hollow://")
    # The Lease is held by its node and, once the node's uid is known, owned by it.
    lease = wait_for(lambda: (lambda lease: lease if lease.get("metadata", {}).get("ownerReferences") else None)(
        kubectl.get("lease", f"{PREFIX}0003", "kube-node-lease")), 20, interval=0.5, what="the Lease's owner")
    assert lease["spec"]["holderIdentity"] == f"{PREFIX}0003"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    kubectl.apply(pod_manifest("sim-before", f"{PREFIX}0003", "exec sleep 3600"))
    pod = wait_pod(kubectl, "sim-before", lambda p: pod_phase(p) == "Running", 30)
    assert pod["status"]["containerStatuses"][0]["state"]["running"]

    # One reconnect: the restarted apiserver has a fresh watch cache, so every node re-lists its pods.
    control_plane.stop_apiserver()
    restarted = time.time()
    control_plane.start_apiserver()

    def reconnected() -> set[str]:
        events = audit.events(user=USER, since=restarted)
        renewed = {e["objectRef"].get("name") for e in events if e.get("verb") == "update"
                   and e.get("objectRef", {}).get("resource") == "leases" and e["responseStatus"]["code"] == 200}
        relisted = {node for node in names for e in events if e.get("verb") == "list"
                    and f"spec.nodeName%3D{node}" in e.get("requestURI", "") and e["responseStatus"]["code"] == 200}
        return renewed & relisted

    wait_for(lambda: reconnected() == names, 60, interval=1.0, what="every hollow node's Lease and pod re-list")
    kubectl.apply(pod_manifest("sim-after", f"{PREFIX}0007", "exec sleep 3600"))
    wait_pod(kubectl, "sim-after", lambda p: pod_phase(p) == "Running", 30)
    wait_for(lambda: ready_nodes(kubectl) == names, 30, interval=0.5, what="ten hollow nodes Ready after the restart")

    simulator.send_signal(signal.SIGTERM)
    assert simulator.wait(timeout=30) == 0
    summary = (tmp_path / "simulate.out").read_text().strip().splitlines()[-1]
    assert f"registered={NODES}" in summary and "crashed_tasks=0" in summary, summary
