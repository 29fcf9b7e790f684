"""Stateful pods on a real 1.36 control plane: PersistentVolumeClaims on hostPath and `local` volumes bound by hand,
and a StatefulSet whose claim template is served by a provisioner that works as k3s's local-path-provisioner does
(WaitForFirstConsumer; a privileged helper pod with a hostPath volume makes and removes each directory on the node;
a hostPath PersistentVolume with the node's affinity). The data outlives a pod delete, an agent killed with -9 and an
offline reboot (the API server down while the agent starts with no containers left). A CSI driver written in the
tests registers with the real API server (the CSINode object) and its volumes mount.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.csi_driver import TOPOLOGY_KEY, read_calls
from tests.e2e.conftest import Kubectl, container_status, pod_phase, wait_pod
from tests.helpers import wait_for
from tests.integration.agent_harness import REPO
from tests.runtime_cleanup import empty_runtime_at

pytestmark = pytest.mark.containerd

IMAGE = "docker.io/library/busybox:local"
CLASS = "edgelet-local-path"
PROVISIONER = "rancher.io/local-path"  # the name local-path-provisioner registers; its PVs carry it
SELECTED_NODE = "volume.kubernetes.io/selected-node"


def running(pod: dict) -> bool:
    return pod_phase(pod) == "Running" and "running" in (container_status(pod).get("state") or {})


def hostname_affinity(node: str) -> dict:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}


# -- the provisioner ---------------------------------------------------------------------------------------------


class LocalPathProvisioner:
    """What local-path-provisioner does, in a thread of the test: for each claim of its class that the scheduler
    gave a node (WaitForFirstConsumer), a helper pod on that node makes the directory, then a hostPath PV with the
    node's affinity is created bound to the claim; a Released volume's directory is removed by a helper pod and the
    PV deleted (reclaimPolicy Delete)."""

    def __init__(self, kubectl: Kubectl, base: Path):
        self.kubectl = kubectl
        self.base = base
        self.helpers: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LocalPathProvisioner:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 - reported by the test; the loop goes on as a controller's would
                self.errors.append(str(e))

    def round(self) -> None:
        for claim in self.kubectl.json("get", "pvc", "-A")["items"]:
            meta, spec = claim["metadata"], claim["spec"]
            node = (meta.get("annotations") or {}).get(SELECTED_NODE)
            if spec.get("storageClassName") == CLASS and not spec.get("volumeName") and node:
                self.provision(claim, node)
        for volume in self.kubectl.json("get", "pv")["items"]:
            provisioned_by = (volume["metadata"].get("annotations") or {}).get("pv.kubernetes.io/provisioned-by")
            if provisioned_by == PROVISIONER and volume.get("status", {}).get("phase") == "Released":
                self.delete(volume)

    def provision(self, claim: dict, node: str) -> None:
        meta = claim["metadata"]
        name = f"pvc-{meta['uid']}"
        if self.kubectl.get("pv", name, None) is not None:
            return
        directory = f"{name}_{meta['namespace']}_{meta['name']}"
        self.helper(f"create-{name}", node, f"mkdir -m 0777 -p /data/{directory}")
        self.kubectl.apply(json.dumps({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {"capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                     "accessModes": claim["spec"]["accessModes"], "persistentVolumeReclaimPolicy": "Delete",
                     "storageClassName": CLASS, "volumeMode": "Filesystem",
                     "hostPath": {"path": str(self.base / directory), "type": "DirectoryOrCreate"},
                     "nodeAffinity": hostname_affinity(node),
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                  "name": meta["name"], "uid": meta["uid"]}}}))

    def delete(self, volume: dict) -> None:
        path = Path(volume["spec"]["hostPath"]["path"])
        node = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0]
        self.helper(f"delete-{volume['metadata']['name']}", node, f"rm -rf /data/{path.name}")
        self.kubectl.run("delete", "pv", volume["metadata"]["name"], "--wait=false")

    def helper(self, name: str, node: str, command: str) -> None:
        """A privileged pod with the base directory as a hostPath volume runs `command` on `node`, then goes."""
        self.kubectl.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "hostNetwork": True,
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "helper-pod", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command], "securityContext": {"privileged": True},
                                     "volumeMounts": [{"name": "data", "mountPath": "/data/"}]}],
                     "volumes": [{"name": "data",
                                  "hostPath": {"path": str(self.base), "type": "DirectoryOrCreate"}}]}}))
        self.helpers.append(name)
        wait_pod(self.kubectl, name, lambda p: pod_phase(p) in ("Succeeded", "Failed"), 60)
        phase = pod_phase(self.kubectl.get("pod", name))
        self.kubectl.run("delete", "pod", name, "--wait=false")
        if phase != "Succeeded":
            raise AssertionError(f"helper pod {name}: {phase}")


def stats_summary(port: int, pki: Path) -> dict:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(f"https://127.0.0.1:{port}/stats/summary", timeout=10) as reply:
        return json.loads(reply.read())


# -- tests ------------------------------------------------------------------------------------------------------


def test_claims_bound_by_hand_to_host_path_and_local_volumes(node_ready, control_plane, kubectl, tmp_path):
    node = control_plane.node
    local_dir = tmp_path / "local-disk"
    local_dir.mkdir()
    manifests = []
    for claim, volume, source, extra in (
            ("host-claim", "host-pv", {"hostPath": {"path": str(tmp_path / "host-disk"), "type": "DirectoryOrCreate"}},
             {}),
            ("local-claim", "local-pv", {"local": {"path": str(local_dir)}},
             {"nodeAffinity": hostname_affinity(node)})):
        manifests.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
                          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                   "storageClassName": "", "claimRef": {"namespace": "default", "name": claim},
                                   **source, **extra}})
        manifests.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                          "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume,
                                   "resources": {"requests": {"storage": "1Gi"}}}})
    try:
        kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
        for claim in ("host-claim", "local-claim"):  # the PV controller completes the binding
            wait_for(lambda claim=claim: (kubectl.get("pvc", claim) or {}).get("status", {}).get("phase") == "Bound",
                     60, interval=0.3, what=f"{claim} Bound")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "claims"},
               "spec": {"nodeName": node, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", "echo x >> /host/runs; echo x >> /local/runs; "
                                                    "exec sleep 3600"],
                                        "volumeMounts": [{"name": "host", "mountPath": "/host"},
                                                         {"name": "local", "mountPath": "/local"}]}],
                        "volumes": [{"name": "host", "persistentVolumeClaim": {"claimName": "host-claim"}},
                                    {"name": "local", "persistentVolumeClaim": {"claimName": "local-claim"}}]}}
        kubectl.apply(json.dumps(pod))
        wait_pod(kubectl, "claims", running, 60)
        assert (tmp_path / "host-disk" / "runs").read_text() == "x\n"
        assert (local_dir / "runs").read_text() == "x\n"
        # The kubelet API's /stats/summary, as the admin (a 1.36 apiserver does not proxy to a loopback node).
        summary = stats_summary(node_ready.kubelet_api_port, control_plane.dir / "pki")
        (entry,) = [p for p in summary["pods"] if p["podRef"]["name"] == "claims"]
        volumes = {v["name"]: v for v in entry["volume"]}
        assert {v["pvcRef"]["name"] for v in volumes.values()} == {"host-claim", "local-claim"}
        assert volumes["local"]["usedBytes"] > 0 and volumes["local"]["capacityBytes"] > 0
        kubectl("delete", "pod", "claims", "--wait=true", timeout=60)
        kubectl.apply(json.dumps(pod))
        wait_pod(kubectl, "claims", running, 60)
        assert (tmp_path / "host-disk" / "runs").read_text() == "x\nx\n"
        assert (local_dir / "runs").read_text() == "x\nx\n"
    finally:
        kubectl.run("delete", "pod", "claims", "--grace-period=0", "--force", check=False)
        kubectl.run("delete", "pvc", "host-claim", "local-claim", "--wait=false", check=False)
        kubectl.run("delete", "pv", "host-pv", "local-pv", "--wait=false", check=False)


STATEFULSET = {
    "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "broker"},
    "spec": {"serviceName": "broker", "replicas": 1, "selector": {"matchLabels": {"app": "broker"}},
             "template": {"metadata": {"labels": {"app": "broker"}},
                          "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                                   "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                                   "command": ["sh", "-c", "echo boot >> /queue/boots; "
                                                               "exec sleep 3600"],
                                                   "volumeMounts": [{"name": "queue", "mountPath": "/queue"}]}]}},
             "volumeClaimTemplates": [{"metadata": {"name": "queue"},
                                       "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                                                "resources": {"requests": {"storage": "64Mi"}}}}]},
}


def test_a_statefulset_on_local_path_volumes_keeps_its_data(node_ready, control_plane, kubectl, containerd, tmp_path):
    base = tmp_path / "local-path-provisioner"
    kubectl.apply(json.dumps({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                              "metadata": {"name": CLASS}, "provisioner": PROVISIONER,
                              "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}))
    agent = node_ready
    try:
        with LocalPathProvisioner(kubectl, base) as provisioner:
            started = time.monotonic()
            kubectl.apply(json.dumps(STATEFULSET))
            first = wait_pod(kubectl, "broker-0", running, 120)
            print(f"\nStatefulSet applied -> broker-0 Running on its provisioned volume: "
                  f"{(time.monotonic() - started) * 1000:.0f} ms")
            (directory,) = [d for d in base.iterdir() if d.name.endswith("_default_queue-broker-0")]
            boots = directory / "boots"
            assert boots.read_text() == "boot\n"

            # A pod delete: the StatefulSet makes a new pod on the same claim.
            kubectl("delete", "pod", "broker-0", "--wait=true", timeout=60)
            wait_pod(kubectl, "broker-0", lambda p: running(p) and p["metadata"]["uid"] != first["metadata"]["uid"],
                     60)
            wait_for(lambda: boots.read_text() == "boot\n" * 2, 10, what="second boot on the same volume")

            # kill -9 and a reboot (no containers left), first online then with the API server down.
            for offline in (False, True):
                agent.kill9()
                empty_runtime_at(containerd.endpoint)
                if offline:
                    control_plane.stop_apiserver()
                try:
                    agent.start()
                    count = 4 if offline else 3
                    wait_for(lambda count=count: boots.read_text() == "boot\n" * count, 60,
                             what=f"boot {count} on the same volume ({'offline' if offline else 'online'})")
                finally:
                    if offline:
                        control_plane.start_apiserver()
            wait_pod(kubectl, "broker-0", running, 60)

            # Scaled to zero and the claim deleted: the provisioner's helper pod removes the directory on the node.
            kubectl("delete", "statefulset", "broker", "--wait=true", timeout=60)
            wait_for(lambda: kubectl.get("pod", "broker-0") is None, 60, what="broker-0 gone")
            kubectl("delete", "pvc", "queue-broker-0", "--wait=true", timeout=60)
            wait_for(lambda: not directory.exists(), 60, interval=0.3, what="the volume's directory removed")
            # Its rounds during the outage failed to reach the API server, as any controller's would; nothing else.
            assert not [e for e in provisioner.errors if "was refused" not in e], provisioner.errors
    finally:
        kubectl.run("delete", "statefulset", "broker", "--wait=false", check=False)
        kubectl.run("delete", "pvc", "queue-broker-0", "--wait=false", check=False)
        kubectl.run("delete", "storageclass", CLASS, "--wait=false", check=False)


# -- CSI ----------------------------------------------------------------------------------------------------------

CSI_DRIVER = "csi.edgelet.e2e"


def test_a_csi_driver_registers_with_the_real_api_server_and_its_volumes_mount(
        cluster_agent, control_plane, kubectl, tmp_path):
    """The CSINode the agent writes as the node passes the real API server's validation and NodeRestriction; a
    pre-provisioned CSI volume and an inline one are published to a pod, unpublished and unstaged when it goes."""
    node = control_plane.node
    log = tmp_path / "driver-calls.jsonl"
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.csi_driver", "--name", CSI_DRIVER, "--registry", str(tmp_path / "registry"),
         "--socket", str(tmp_path / "plugins" / CSI_DRIVER / "csi.sock"), "--base", str(tmp_path / "backing"),
         "--log", str(log), "--node-id", f"{node}-id"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    calls = lambda method: [c for c in read_calls(log) if c["method"] == method]  # noqa: E731
    kubectl.apply(json.dumps({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": CSI_DRIVER},
                              "spec": {"attachRequired": False, "podInfoOnMount": True,
                                       "volumeLifecycleModes": ["Persistent", "Ephemeral"]}}))
    try:
        cluster_agent(f'\n[csi]\nplugins_registry = "{tmp_path / "registry"}"\n')
        csinode = wait_for(lambda: (n := kubectl.get("csinode", node, None)) and n["spec"]["drivers"] and n, 60,
                           interval=0.3, what="CSINode with the driver")
        assert csinode["spec"]["drivers"][0]["nodeID"] == f"{node}-id"
        assert csinode["spec"]["drivers"][0]["topologyKeys"] == [TOPOLOGY_KEY]
        kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "csi-pv"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                      "claimRef": {"namespace": "default", "name": "csi-claim"},
                      "csi": {"driver": CSI_DRIVER, "volumeHandle": "e2e-vol"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "csi-claim"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": "csi-pv",
                      "resources": {"requests": {"storage": "1Gi"}}}}]}))
        wait_for(lambda: (kubectl.get("pvc", "csi-claim") or {}).get("status", {}).get("phase") == "Bound", 60,
                 interval=0.3, what="csi-claim Bound")
        kubectl.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "csi-user"},
            "spec": {"nodeName": node, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "echo hi > /data/hello; exec sleep 3600"],
                                     "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                                      {"name": "scratch", "mountPath": "/scratch"}]}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "csi-claim"}},
                                 {"name": "scratch", "csi": {"driver": CSI_DRIVER}}]}}))
        wait_pod(kubectl, "csi-user", running, 60)
        wait_for(lambda: (tmp_path / "backing" / "e2e-vol" / "hello").exists(), 10, what="written through the volume")
        assert [c["volume_id"] for c in calls("NodeStageVolume")] == ["e2e-vol"]
        assert len(calls("NodePublishVolume")) == 2
        kubectl("delete", "pod", "csi-user", "--wait=true", timeout=60)
        wait_for(lambda: len(calls("NodeUnpublishVolume")) == 2 and calls("NodeUnstageVolume"), 30,
                 what="unpublished and unstaged")
    finally:
        driver.terminate()
        driver.wait(10)
        kubectl.run("delete", "pod", "csi-user", "--grace-period=0", "--force", check=False)
        kubectl.run("delete", "pvc", "csi-claim", "--wait=false", check=False)
        kubectl.run("delete", "pv", "csi-pv", "--wait=false", check=False)
        kubectl.run("delete", "csidriver", CSI_DRIVER, "--wait=false", check=False)
