"""Pure parts of the CSI node side: the kubelet's paths and names, vol_data.json, the CSINode object, the versions a
driver may offer, the capability asked for, and which registry entries are plugin sockets."""

from __future__ import annotations

import hashlib
import socket

import pytest

from edgelet.csi import csi_pb2 as csi
from edgelet.csi.client import volume_capability
from edgelet.csi.csinode import csinode_object
from edgelet.csi.drivers import Driver
from edgelet.csi.paths import (
    VolumeRecord,
    attachment_name,
    ephemeral_handle,
    publish_path,
    staging_path,
)
from edgelet.csi.registration import supported_version
from edgelet.csi.watcher import plugin_sockets


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_kubelets_paths_and_names():
    assert staging_path("/var/lib/kubelet/plugins", "ebs.csi.aws.com", "vol-1") == (
        f"/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/{sha('vol-1')}/globalmount")
    assert publish_path("/var/lib/kubelet/pods/u1", "pv-1") == (
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-1/mount")
    assert attachment_name("vol-1", "ebs.csi.aws.com", "node-a") == "csi-" + sha("vol-1ebs.csi.aws.comnode-a")
    assert ephemeral_handle("u1", "scratch") == "csi-" + sha("u1scratch")


def test_volume_records_round_trip_and_refuse_what_is_incomplete():
    record = VolumeRecord("pv-1", "vol-1", "d", "node-a", "csi-x")
    assert VolumeRecord.from_json(record.as_json()) == record
    assert record.as_json()["volumeLifecycleMode"] == "Persistent"
    assert VolumeRecord.from_json({"specVolID": "pv", "volumeHandle": "", "driverName": "d", "nodeName": "n"}) is None
    assert VolumeRecord.from_json({"specVolID": "pv"}) is None
    assert VolumeRecord.from_json([]) is None


def test_the_csinode_object_has_our_drivers_and_keeps_what_the_server_holds():
    drivers = {"b": Driver("b", "/s", "id-b"), "a": Driver("a", "/s", "id-a", {"zone": "z1", "rack": "r"}, 8)}
    created = csinode_object("node-a", "uid-1", drivers, None)
    assert created["metadata"] == {"name": "node-a", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1"}]}
    assert created["spec"]["drivers"] == [
        {"name": "a", "nodeID": "id-a", "topologyKeys": ["rack", "zone"], "allocatable": {"count": 8}},
        {"name": "b", "nodeID": "id-b"}]
    existing = {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "node-a", "resourceVersion": "7", "ownerReferences": [{"uid": "old"}]},
                "spec": {"drivers": [{"name": "gone", "nodeID": "x"}]}}
    updated = csinode_object("node-a", "uid-1", {}, existing)
    assert updated["metadata"]["resourceVersion"] == "7" and updated["metadata"]["ownerReferences"] == [{"uid": "old"}]
    assert updated["spec"] == {"drivers": []}


@pytest.mark.parametrize(("versions", "chosen"), [
    (["1.0.0"], "1.0.0"), (["v1.5.0"], "v1.5.0"), (["0.3.0", "1.2"], "1.2"), (["0.3.0"], None), (["2.0.0"], None),
    ([], None), (["latest"], None)])
def test_a_driver_must_offer_csi_1(versions, chosen):
    assert supported_version(versions) == chosen


def test_the_capability_asked_for():
    mode = csi.VolumeCapability.AccessMode
    assert volume_capability(["ReadWriteMany"], "ext4", ["noatime"]) == csi.VolumeCapability(
        mount=csi.VolumeCapability.MountVolume(fs_type="ext4", mount_flags=["noatime"]),
        access_mode=mode(mode=mode.MULTI_NODE_MULTI_WRITER))
    assert volume_capability(None).access_mode.mode == mode.SINGLE_NODE_WRITER
    assert volume_capability(["ReadWriteOncePod"]).access_mode.mode == mode.SINGLE_NODE_SINGLE_WRITER


def test_only_sockets_not_hidden_are_plugins(tmp_path):
    listeners = []
    for name in ("driver-reg.sock", ".hidden.sock"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(tmp_path / name))
        listeners.append(listener)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    try:
        assert plugin_sockets(str(tmp_path)) == {str(tmp_path / "driver-reg.sock")}
        assert plugin_sockets(str(tmp_path / "missing")) == set()
    finally:
        for listener in listeners:
            listener.close()
