"""API pods through a real kube-apiserver: the whole life of a pod as `kubectl` shows it.

Pending -> Running, readiness flipping both ways, restarts and CrashLoopBackOff counted, init containers,
Succeeded and Failed, a graceful `kubectl delete` within the grace period, ConfigMap and Secret updates
reaching the files of a running pod.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import condition, container_status, pod_phase, wait_pod
from tests.e2e.harness import IMAGE, pod_manifest
from tests.helpers import wait_for

pytestmark = pytest.mark.containerd





def test_pod_runs_and_readiness_flips_both_ways_within_2s(node_ready, control_plane, kubectl, tmp_path):
    """Readiness reads a file of a hostPath directory that the test controls from outside the pod."""
    node = control_plane.node
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    ready_file = probe_dir / "ready"
    ready_file.touch()
    created = time.monotonic()
    kubectl.apply(pod_manifest(
        "ready-flip", node, "exec sleep 3600",
        extra_spec={"volumes": [{"name": "probe", "hostPath": {"path": str(probe_dir)}}]},
        container={"readinessProbe": {"exec": {"command": ["cat", "/probe/ready"]}, "periodSeconds": 1},
                   "volumeMounts": [{"name": "probe", "mountPath": "/probe"}]}))
    pod = wait_pod(kubectl, "ready-flip", lambda p: condition(p, "Ready") == "True", 30)
    to_ready = time.monotonic() - created
    assert pod_phase(pod) == "Running"
    assert container_status(pod)["ready"] is True
    assert "running" in container_status(pod)["state"]
    for kind in ("Initialized", "ContainersReady", "PodScheduled"):
        assert condition(pod, kind) == "True", kind
    assert pod["status"]["podIP"] and pod["status"]["startTime"]

    ready_file.unlink()
    started = time.monotonic()
    wait_pod(kubectl, "ready-flip", lambda p: condition(p, "Ready") == "False", 15)
    not_ready_after = time.monotonic() - started
    ready_file.touch()
    started = time.monotonic()
    wait_pod(kubectl, "ready-flip", lambda p: condition(p, "Ready") == "True", 10)
    ready_after = time.monotonic() - started
    # failureThreshold 3 at a 1 s period: the prober decides within ~3 s, the API must follow within 2 s.
    assert not_ready_after <= 3 + 1 + 2, not_ready_after
    assert ready_after <= 1 + 2, ready_after
    print(f"created->Ready in the API {to_ready:.2f}s; probe failing->API NotReady {not_ready_after:.2f}s; "
          f"probe passing->API Ready {ready_after:.2f}s")


def test_restarts_and_crash_loop_are_counted(node_ready, control_plane, kubectl):
    kubectl.apply(pod_manifest("crasher", control_plane.node, "sleep 0.2; exit 3"))
    pod = wait_pod(kubectl, "crasher", lambda p: container_status(p).get("restartCount", 0) >= 2, 60)
    status = container_status(pod)
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    wait_pod(kubectl, "crasher", lambda p: (container_status(p).get("state") or {}).get("waiting", {})
             .get("reason") == "CrashLoopBackOff", 30)
    assert "CrashLoopBackOff" in kubectl("get", "pod", "crasher")


def test_init_containers_then_succeeded_and_failed(node_ready, control_plane, kubectl):
    node = control_plane.node
    init = {"initContainers": [{"name": "init", "image": IMAGE, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", "sleep 0.5"]}]}
    kubectl.apply(pod_manifest("succeeds", node, "exit 0", restart_policy="Never", extra_spec=init))
    kubectl.apply(pod_manifest("fails", node, "exit 7", restart_policy="Never"))
    done = wait_pod(kubectl, "succeeds", lambda p: pod_phase(p) == "Succeeded", 60)
    init_status = done["status"]["initContainerStatuses"][0]
    assert init_status["state"]["terminated"]["exitCode"] == 0
    assert condition(done, "Initialized") == "True"
    assert container_status(done)["state"]["terminated"]["reason"] == "Completed"
    failed = wait_pod(kubectl, "fails", lambda p: pod_phase(p) == "Failed", 60)
    assert container_status(failed)["state"]["terminated"]["exitCode"] == 7


def test_graceful_delete_finishes_within_the_grace_period(node_ready, control_plane, kubectl):
    # PID 1 traps TERM and exits: the pod must be gone well before the 30 s a kill would take.
    kubectl.apply(pod_manifest("graceful", control_plane.node,
                               "trap 'exit 0' TERM; while true; do sleep 0.1; done", grace=30))
    wait_pod(kubectl, "graceful", lambda p: "running" in (container_status(p).get("state") or {}), 30)
    started = time.monotonic()
    kubectl.run("delete", "pod", "graceful", "--wait=true", timeout=60)
    took = time.monotonic() - started
    assert took < 10, f"kubectl delete took {took:.1f}s"
    print(f"kubectl delete (TERM honoured) took {took:.2f}s")


def test_configmap_and_secret_updates_reach_the_files(node_ready, control_plane, kubectl):
    kubectl("create", "configmap", "app-config", "--from-literal=greeting=hello")
    kubectl("create", "secret", "generic", "app-secret", "--from-literal=token=s3cret")
    try:
        kubectl.apply(pod_manifest(
            "reader", control_plane.node, "exec sleep 3600",
            extra_spec={"volumes": [{"name": "config", "configMap": {"name": "app-config"}},
                                    {"name": "secret", "secret": {"secretName": "app-secret"}}]},
            container={"volumeMounts": [{"name": "config", "mountPath": "/config"},
                                        {"name": "secret", "mountPath": "/secret"}]}))
        pod = wait_pod(kubectl, "reader", lambda p: pod_phase(p) == "Running", 60)
        uid = pod["metadata"]["uid"]
        root = node_ready.root_dir / "pods" / uid / "volumes"
        config_file = root / "kubernetes.io~configmap" / "config" / "greeting"
        secret_file = root / "kubernetes.io~secret" / "secret" / "token"
        wait_for(lambda: config_file.exists() and config_file.read_text() == "hello", 10, what="configmap file")
        assert secret_file.read_text() == "s3cret"

        kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config"},
                                  "data": {"greeting": "bonjour"}}))
        # The agent refreshes referenced objects periodically (the kubelet's ttl-based cache, ~1 min).
        wait_for(lambda: config_file.read_text() == "bonjour", 90, interval=0.5, what="the updated ConfigMap file")
    finally:
        kubectl.run("delete", "configmap", "app-config", check=False)
        kubectl.run("delete", "secret", "app-secret", check=False)
