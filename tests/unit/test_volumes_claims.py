"""Pure resolution of a pod's PersistentVolumeClaims to a hostPath or `local` directory: the kubelet's checks and
messages, node selectors, and the labels a `local` volume's nodeAffinity is matched with."""

from __future__ import annotations

import pytest

from edgelet.api.objectstore import ObjectStore
from edgelet.volumes.claims import (
    ClaimedVolume,
    ClaimError,
    CsiSource,
    inline_csi,
    node_labels,
    node_selector_matches,
    resolve_claim,
)

NS = "apps"
NODE = "edge-1"
LABELS = {"kubernetes.io/hostname": "edge-1", "zone": "a", "disks": "3"}


def claim(name="data", volume="pv1", phase="Bound", **meta):
    return {"kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS, "uid": "c-uid", **meta},
            "spec": {"volumeName": volume} if volume else {}, "status": {"phase": phase}}


def pv(name="pv1", claim_uid="c-uid", **spec):
    spec = spec or {"hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}}
    return {"kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"claimRef": {"namespace": NS, "name": "data", "uid": claim_uid} if claim_uid else None, **spec}}


def local(terms=None, path="/mnt/disks/ssd1"):
    spec = {"local": {"path": path}}
    if terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    return spec


def resolve(objects, volume=None, mounted=("v",), devices=()):
    store = ObjectStore()
    for obj in objects:
        store.put(obj)
    volume = volume or {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}
    return resolve_claim("web-0", NS, "pod-uid", volume, store.get, node_name=NODE, node_labels=LABELS,
                         mounted=mounted, devices=devices)


def test_a_bound_claim_on_a_host_path_volume():
    assert resolve([claim(), pv()]) == ClaimedVolume(f"{NS}/data", "pv1", "hostPath", "/srv/data",
                                                     "DirectoryOrCreate", False)


def test_read_only_comes_from_the_pods_claim_source():
    volume = {"name": "v", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    assert resolve([claim(), pv()], volume).read_only is True


def test_a_local_volume_whose_affinity_matches_this_node():
    terms = [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["edge-1"]}]}]
    assert resolve([claim(), pv(**local(terms))]) == ClaimedVolume(f"{NS}/data", "pv1", "local", "/mnt/disks/ssd1",
                                                                   None, False)


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([], 'error processing PVC apps/data: failed to fetch PVC from API server: persistentvolumeclaims "data" '
             "not found"),
        ([claim(volume="", phase="Pending")],
         'error processing PVC apps/data: PVC apps/data has non-bound phase ("Pending") or empty '
         'pvc.Spec.VolumeName ("")'),
        ([claim(deletionTimestamp="2026-01-01T00:00:00Z"), pv()],
         "error processing PVC apps/data: can't start pod because PVC apps/data is being deleted"),
        ([claim()], 'error processing PVC apps/data: failed to fetch PV pv1 from API server: persistentvolumes "pv1" '
                    "not found"),
        ([claim(), pv(claim_uid="")], "error processing PVC apps/data: found PV object pv1 but it has a nil or empty "
                                      "spec.claimRef indicating it is either unbound or has been bound to a different "
                                      "claim"),
        ([claim(), pv(claim_uid="other")], "error processing PVC apps/data: found PV object pv1 but its "
                                           "spec.claimRef.UID (other) does not point to claim.UID (c-uid)"),
        ([claim(), pv(volumeMode="Block", local={"path": "/dev/sdb"})],
         "volume v has volumeMode Block, but is specified in volumeMounts"),
        ([claim(), pv(nfs={"server": "nas", "path": "/export"})],
         "PersistentVolume pv1: volume type nfs is not supported on this node (edgelet mounts hostPath, local and "
         "csi volumes)"),
        ([claim(), pv(hostPath={"path": "relative"})], "PersistentVolume pv1: hostPath path must be absolute"),
        ([claim(), pv(**local(path="/mnt/../etc"))], "PersistentVolume pv1: local.path must be an absolute path"),
        ([claim(), pv(**local([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": ["edge-2"]}]}]))],
         'MountVolume.NodeAffinity check failed for volume "pv1" : no matching NodeSelectorTerms'),
    ],
)
def test_what_keeps_a_claim_from_being_mounted(objects, message):
    with pytest.raises(ClaimError) as caught:
        resolve(objects)
    assert caught.value.message.startswith(message)


def test_a_csi_volume_and_an_inline_one():
    spec = {"csi": {"driver": "hostpath.csi.example", "volumeHandle": "vol-1", "fsType": "ext4",
                    "volumeAttributes": {"b": "2", "a": "1"}, "nodeStageSecretRef": {"name": "s", "namespace": "ops"}},
            "accessModes": ["ReadWriteMany"], "mountOptions": ["noatime"]}
    claimed = resolve([claim(), pv(**spec)])
    assert claimed.kind == "csi" and claimed.csi == CsiSource(
        "hostpath.csi.example", "vol-1", fs_type="ext4", attributes=(("a", "1"), ("b", "2")),
        access_modes=("ReadWriteMany",), mount_options=("noatime",), stage_secret=("ops", "s"))
    inline = inline_csi({"name": "v", "csi": {"driver": "d", "readOnly": True, "nodePublishSecretRef": {"name": "p"}}},
                        NS)
    assert inline == CsiSource("d", "", read_only=True, publish_secret=(NS, "p"), ephemeral=True)
    with pytest.raises(ClaimError, match="csi.driver and csi.volumeHandle are required"):
        resolve([claim(), pv(csi={"driver": "d"})])


def test_raw_block_volumes_are_refused_with_a_reason():
    with pytest.raises(ClaimError, match="raw block volumes .* are not supported by edgelet"):
        resolve([claim(), pv(volumeMode="Block", local={"path": "/dev/sdb"})], mounted=(), devices=("v",))
    with pytest.raises(ClaimError, match="volume v has volumeMode Filesystem, but is specified in volumeDevices"):
        resolve([claim(), pv()], mounted=(), devices=("v",))


def test_an_ephemeral_volume_uses_the_claim_made_for_its_pod():
    volume = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
    owned = claim("web-0-scratch", ownerReferences=[{"kind": "Pod", "uid": "pod-uid", "controller": True}])
    assert resolve([owned, pv()], volume, mounted=("scratch",)).claim == f"{NS}/web-0-scratch"
    with pytest.raises(ClaimError, match=r"PVC apps/web-0-scratch was not created for pod apps/web-0 \(pod is not "
                                         r"owner\)"):
        resolve([claim("web-0-scratch"), pv()], volume, mounted=("scratch",))


@pytest.mark.parametrize(
    ("terms", "matches"),
    [
        ([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}], True),
        ([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}], False),
        ([{"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["a"]}]}], True),
        ([{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}], True),
        ([{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}], False),
        ([{"matchExpressions": [{"key": "disks", "operator": "Gt", "values": ["2"]}]}], True),
        ([{"matchExpressions": [{"key": "disks", "operator": "Lt", "values": ["2"]}]}], False),
        ([{"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["2"]}]}], False),  # not a number
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["edge-1"]}]}], True),
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["edge-2"]}]}], False),
        # Requirements of a term are ANDed, terms ORed; an empty term matches nothing.
        ([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                {"key": "rack", "operator": "Exists"}]}], False),
        ([{"matchExpressions": [{"key": "rack", "operator": "Exists"}]},
          {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}], True),
        ([{}], False),
        ([], False),
        ("not a list", False),
    ],
)
def test_node_selector_terms(terms, matches):
    assert node_selector_matches(terms, LABELS, NODE) is matches


def test_node_labels_are_the_configured_and_the_well_known_ones():
    assert node_labels("Edge-1", {"zone": "a", "kubernetes.io/os": "windows"}, machine="aarch64") == {
        "zone": "a", "kubernetes.io/hostname": "edge-1", "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}


@pytest.mark.parametrize(("policy", "fs_type", "modes", "ephemeral", "applies"), [
    ("File", "", ("ReadWriteMany",), False, True),
    ("None", "ext4", ("ReadWriteOnce",), False, False),
    (None, "ext4", ("ReadWriteOnce",), False, True),
    ("ReadWriteOnceWithFSType", "", ("ReadWriteOnce",), False, False),
    ("ReadWriteOnceWithFSType", "ext4", ("ReadWriteMany",), False, False),
    ("ReadWriteOnceWithFSType", "ext4", ("ReadWriteOnce", "ReadOnlyMany"), False, False),
    ("ReadWriteOnceWithFSType", "ext4", (), True, True),
])
def test_when_a_csi_volume_gets_the_pods_fs_group(policy, fs_type, modes, ephemeral, applies):
    from edgelet.volumes.csi import applies_fs_group

    source = CsiSource("d", "h", fs_type=fs_type, access_modes=modes, ephemeral=ephemeral)
    assert applies_fs_group(policy, source) is applies
