"""CSI node plugins end to end: a driver written in the tests (tests/csi_driver.py, its own process, recording its
calls) registers through the plugins_registry directory; the real agent writes the CSINode object into the API
server double, stages a claim's volume once for the node, publishes it per pod at the kubelet's paths, publishes an
inline ephemeral volume, and unpublishes and unstages when pods go, also after an agent killed with -9 while they
went.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgelet.csi import paths
from tests.csi_driver import TOPOLOGY_KEY, read_calls
from tests.helpers import wait_for
from tests.integration.agent_harness import REPO, AgentProcess
from tests.integration.cluster_harness import (
    CLUSTER_TOML,
    NODE,
    api_get,
    api_pod,
    bind_by_hand,
    claim_volume,
    failed_mount,
    remove_pod_from_runtime,
    running_in_api,
    unmount_below,
)

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

DRIVER = "csi.edgelet.test"


@pytest.fixture
def driver(tmp_path):
    log = tmp_path / "driver-calls.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.csi_driver", "--name", DRIVER, "--registry", str(tmp_path / "registry"),
         "--socket", str(tmp_path / "plugins" / DRIVER / "csi.sock"), "--base", str(tmp_path / "backing"),
         "--log", str(log), "--node-id", "device-42"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    process.calls = lambda method=None: [c for c in read_calls(log) if method in (None, c["method"])]
    process.backing = tmp_path / "backing"
    yield process
    process.terminate()
    process.wait(10)


@pytest.fixture
def csi_agent(tmp_path, containerd, api):
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    toml = (CLUSTER_TOML.format(kubeconfig=kubeconfig) + '\n[kubelet_api]\naddress = "127.0.0.1:0"\n'
            + f'\n[csi]\nplugins_registry = "{tmp_path / "registry"}"\n')
    process = AgentProcess(tmp_path, containerd.endpoint, node_name=NODE, extra_toml=toml)
    yield process
    process.stop()
    unmount_below(tmp_path)


def publishes(driver, volume_id: str) -> list[dict]:
    return [c for c in driver.calls("NodePublishVolume") if c["volume_id"] == volume_id]


def test_a_csi_driver_registers_stages_once_publishes_per_pod_and_cleans_up_after_a_kill(
        driver, csi_agent, api, containerd, tmp_path: Path):
    api.create("csidrivers", {"metadata": {"name": DRIVER}, "spec": {
        "attachRequired": False, "podInfoOnMount": True, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}})
    bind_by_hand(api, "shared", "pv-csi", {"csi": {"driver": DRIVER, "volumeHandle": "vol-1",
                                                   "volumeAttributes": {"tier": "fast"}}},
                 accessModes=["ReadWriteMany"])
    csi_agent.start()

    # Registration: GetInfo, NodeGetInfo, the CSINode object, then the plugin is told.
    csinode = wait_for(lambda: (n := api_get(api, "csinodes", NODE)) and n["spec"]["drivers"] and n, 30,
                       what="CSINode with the driver")
    assert csinode["spec"]["drivers"] == [{"name": DRIVER, "nodeID": "device-42", "topologyKeys": [TOPOLOGY_KEY],
                                           "allocatable": {"count": 8}}]
    assert csinode["metadata"]["ownerReferences"][0]["kind"] == "Node"
    wait_for(lambda: driver.calls("NotifyRegistrationStatus"), 10, what="registration status sent")
    assert driver.calls("NotifyRegistrationStatus")[0]["registered"] is True

    write = "echo $HOSTNAME-wrote >> /mnt/data/log; exec sleep 3600"
    uids = {name: api.create("pods", api_pod(name, write, volumes=[claim_volume("data", "shared")]))["metadata"]["uid"]
            for name in ("one", "two")}
    inline = api_pod("inline", "exec sleep 3600",
                     volumes=[{"name": "scratch", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}}])
    uids["inline"] = api.create("pods", inline)["metadata"]["uid"]
    for name in uids:
        wait_for(lambda name=name: running_in_api(api, name), 60, what=f"{name} Running")

    staged = driver.calls("NodeStageVolume")
    assert [c["volume_id"] for c in staged] == ["vol-1"]  # once for the node, whatever the pods
    assert staged[0]["staging"] == paths.staging_path(str(csi_agent.root_dir / "plugins"), DRIVER, "vol-1")
    assert staged[0]["context"] == {"tier": "fast"}
    targets = sorted(c["target"] for c in publishes(driver, "vol-1"))
    assert targets == sorted(str(csi_agent.root_dir / "pods" / uids[n] / "volumes" / "kubernetes.io~csi" / "pv-csi"
                                 / "mount") for n in ("one", "two"))
    assert all(c["staging"] == staged[0]["staging"] for c in publishes(driver, "vol-1"))
    assert publishes(driver, "vol-1")[0]["context"]["csi.storage.k8s.io/pod.namespace"] == "default"
    (ephemeral,) = [c for c in driver.calls("NodePublishVolume") if c["volume_id"] != "vol-1"]
    assert ephemeral["volume_id"] == paths.ephemeral_handle(uids["inline"], "scratch") and ephemeral["staging"] == ""
    assert ephemeral["context"]["csi.storage.k8s.io/ephemeral"] == "true"
    wait_for(lambda: (driver.backing / "vol-1" / "log").exists()
             and len((driver.backing / "vol-1" / "log").read_text().splitlines()) == 2, 10,
             what="both pods wrote through the published volume")

    # One pod goes: its volume is unpublished, the staged volume stays for the other.
    api.delete("pods", "one", "default", grace_period=0)
    wait_for(lambda: [c for c in driver.calls("NodeUnpublishVolume") if uids["one"] in c["target"]], 30,
             what="unpublish for pod one")
    assert not driver.calls("NodeUnstageVolume")

    # The agent dies; the other pods go meanwhile. Restarted, it unpublishes and unstages from what is on disk.
    csi_agent.kill9()
    for name in ("two", "inline"):
        api.delete("pods", name, "default", grace_period=0)
        remove_pod_from_runtime(containerd.endpoint, uids[name])
    csi_agent.start()
    wait_for(lambda: [c["volume_id"] for c in driver.calls("NodeUnstageVolume")] == ["vol-1"], 60,
             what="unstage after the restart")
    unpublished = {c["target"] for c in driver.calls("NodeUnpublishVolume")}
    assert {str(csi_agent.root_dir / "pods" / uids[n]) in " ".join(unpublished) for n in uids} == {True}
    assert not (csi_agent.root_dir / "plugins" / "kubernetes.io" / "csi" / DRIVER).exists() or not any(
        (csi_agent.root_dir / "plugins" / "kubernetes.io" / "csi" / DRIVER).iterdir())
    assert (driver.backing / "vol-1" / "log").read_text().count("-wrote") == 2  # the data stays with the driver


def test_a_driver_that_goes_away_is_removed_from_the_csinode(driver, csi_agent, api):
    csi_agent.start()
    wait_for(lambda: (n := api_get(api, "csinodes", NODE)) and n["spec"]["drivers"], 30, what="driver registered")
    driver.terminate()
    driver.wait(10)
    wait_for(lambda: api_get(api, "csinodes", NODE)["spec"]["drivers"] == [], 30, what="driver gone from CSINode")


def test_a_volume_waits_for_its_attachment_when_the_driver_requires_it(driver, csi_agent, api):
    """No CSIDriver object: attaching is required (the API's default). The pod waits until the attach/detach
    controller's VolumeAttachment says attached; its metadata reaches the driver as the publish context."""
    bind_by_hand(api, "attached", "pv-attached", {"csi": {"driver": DRIVER, "volumeHandle": "vol-2"}})
    csi_agent.start()
    api.create("pods", api_pod("waits", volumes=[claim_volume("data", "attached")]))
    name = paths.attachment_name("vol-2", DRIVER, NODE)
    message = wait_for(lambda: failed_mount(api, "waits", "volume attachment"), 30, what="FailedMount event")
    assert f"volume vol-2 has GET error for volume attachment {name}" in message  # none yet: NotFound
    assert not driver.calls("NodeStageVolume")
    api.create("volumeattachments", {
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": "pv-attached"}},
        "status": {"attached": True, "attachmentMetadata": {"devicePath": "/dev/test0"}}})
    wait_for(lambda: running_in_api(api, "waits"), 60, what="waits Running once attached")
    (staged,) = driver.calls("NodeStageVolume")
    assert staged["publish_context"] == {"devicePath": "/dev/test0"}


def test_a_volume_left_staged_by_a_crash_is_unstaged_when_its_driver_registers(driver, csi_agent, api, containerd):
    """The pod's unpublish done and its directory gone, the unstage not yet (a kill -9 between them): the unstage
    pass after the driver registers again finds the staged volume no pod publishes."""
    api.create("csidrivers", {"metadata": {"name": DRIVER}, "spec": {"attachRequired": False}})
    bind_by_hand(api, "left", "pv-left", {"csi": {"driver": DRIVER, "volumeHandle": "vol-3"}})
    csi_agent.start()
    uid = api.create("pods", api_pod("left", volumes=[claim_volume("data", "left")]))["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "left"), 60, what="left Running")
    csi_agent.kill9()
    api.delete("pods", "left", "default", grace_period=0)
    remove_pod_from_runtime(containerd.endpoint, uid)
    pod_dir = csi_agent.root_dir / "pods" / uid
    subprocess.run(["umount", str(pod_dir / "volumes" / "kubernetes.io~csi" / "pv-left" / "mount")], check=True)
    unmount_below(pod_dir)
    subprocess.run(["rm", "-rf", "--one-file-system", str(pod_dir)], check=True)
    assert not driver.calls("NodeUnstageVolume")
    csi_agent.start()
    wait_for(lambda: [c["volume_id"] for c in driver.calls("NodeUnstageVolume")] == ["vol-3"], 30,
             what="unstage after the driver registered again")


def test_an_inline_volume_needs_a_driver_that_says_it_serves_them(driver, csi_agent, api):
    api.create("csidrivers", {"metadata": {"name": DRIVER}, "spec": {"attachRequired": False}})
    csi_agent.start()
    api.create("pods", api_pod("inline", volumes=[{"name": "scratch", "csi": {"driver": DRIVER}}]))
    wait_for(lambda: failed_mount(api, "inline", f'volume mode "Ephemeral" not supported by driver {DRIVER} (only '
                                                 'supports ["Persistent"])'), 30, what="FailedMount event")
    assert not driver.calls("NodePublishVolume")


def test_the_pods_fs_group_is_given_to_a_volume_where_the_driver_says_so(driver, csi_agent, api):
    api.create("csidrivers", {"metadata": {"name": DRIVER}, "spec": {"attachRequired": False, "fsGroupPolicy": "File"}})
    bind_by_hand(api, "owned", "pv-owned", {"csi": {"driver": DRIVER, "volumeHandle": "vol-4"}})
    csi_agent.start()
    pod = api_pod("owned", volumes=[claim_volume("data", "owned")])
    pod["spec"]["securityContext"] = {"fsGroup": 4321}
    api.create("pods", pod)
    wait_for(lambda: running_in_api(api, "owned"), 60, what="owned Running")
    assert (driver.backing / "vol-4").stat().st_gid == 4321
