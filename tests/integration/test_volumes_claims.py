"""PersistentVolumeClaims end to end: the real agent, the API server double and the private containerd. Claims bound
by hand to hostPath and `local` volumes, a claim that waits while Pending, the kubelet's refusals, and a pod brought
back on the same directory by an agent killed and restarted while the API server is down.
"""

from __future__ import annotations

import os
import time

import pytest

from edgelet.checkpoint import filename_to_key
from tests.integration.agent_harness import wait_for
from tests.integration.test_cluster import (
    NODE,
    agent,  # noqa: F401  (fixture)
    api,  # noqa: F401  (fixture)
    api_get,
    api_pod,
    main_status,
    remove_pod_from_runtime,
    running_in_api,
    running_locally,
)

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def claim(name: str, volume: str = "") -> dict:
    bound = {"spec": {"volumeName": volume}, "status": {"phase": "Bound"}} if volume else {"status": {"phase": "Pending"}}
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **bound.get("spec", {})}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": bound["status"]}


def persistent_volume(name: str, claim_obj: dict, source: dict, **spec) -> dict:
    meta = claim_obj["metadata"]
    return {"metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], **source, **spec,
                     "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}},
            "status": {"phase": "Bound"}}


def bind_by_hand(api, claim_name: str, volume_name: str, source: dict, **spec) -> None:
    """What an administrator (or the PV controller) does: a claim Bound to a volume whose claimRef points back."""
    created = api.create("persistentvolumeclaims", claim(claim_name, volume_name))
    api.create("persistentvolumes", persistent_volume(volume_name, created, source, **spec))


def on_node(path: str) -> dict:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [path]}]}]}}


def claim_volume(name: str, claim_name: str, **source) -> dict:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim_name, **source}}


def failed_mount(api, pod_name: str, part: str) -> str | None:
    for event in api.list("events", namespace="default"):
        if (event.get("involvedObject") or {}).get("name") == pod_name and event.get("reason") == "FailedMount" \
                and part in event.get("message", ""):
            return event["message"]
    return None


def logs(agent, name: str) -> str:
    return agent.cli("logs", name).stdout


def test_host_path_and_local_claims_mount_the_node_directory_and_keep_data(agent, api, tmp_path):
    host_dir, local_dir = tmp_path / "hostpath-pv", tmp_path / "local-pv"
    local_dir.mkdir()
    bind_by_hand(api, "host-data", "pv-host", {"hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}})
    bind_by_hand(api, "local-data", "pv-local", {"local": {"path": str(local_dir)}}, nodeAffinity=on_node(NODE))
    bind_by_hand(api, "shared", "pv-shared", {"hostPath": {"path": str(local_dir)}})
    agent.start()
    command = ("cat /mnt/host/count /mnt/local/count 2>/dev/null; echo run >> /mnt/host/count; "
               "echo run >> /mnt/local/count; touch /mnt/ro/x 2>/dev/null || echo read-only-refused; exec sleep 3600")
    pod = api_pod("db", command, volumes=[claim_volume("host", "host-data"), claim_volume("local", "local-data"),
                                          claim_volume("ro", "shared", readOnly=True)])
    pod["spec"]["securityContext"] = {"fsGroup": 2345}
    uid = api.create("pods", pod)["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "db"), 60, what="db Running")
    wait_for(lambda: "read-only-refused" in logs(agent, "db"), 10, what="the read-only claim refused a write")
    assert (host_dir / "count").read_text() == "run\n"  # DirectoryOrCreate made the hostPath directory
    assert (local_dir / "count").read_text() == "run\n"
    # The local volume is bind-mounted where the kubelet puts it, and got the pod's fsGroup on that first mount.
    mount_point = agent.root_dir / "pods" / uid / "volumes" / "kubernetes.io~local-volume" / "pv-local"
    assert os.path.ismount(mount_point)
    assert local_dir.stat().st_gid == 2345

    api.delete("pods", "db", "default", grace_period=0)
    wait_for(lambda: not (agent.root_dir / "pods" / uid).exists(), 30, what="the pod directory torn down")
    assert (local_dir / "count").read_text() == "run\n"  # the data stays where the volume is
    api.create("pods", pod)
    wait_for(lambda: "run\nrun\n" in logs(agent, "db"), 60, what="the new pod read both volumes' data")


def test_a_pending_claim_waits_with_an_event_and_the_pod_starts_once_bound(agent, api, tmp_path):
    pending = api.create("persistentvolumeclaims", claim("late"))
    agent.start()
    api.create("pods", api_pod("waits", volumes=[claim_volume("data", "late")]))
    message = wait_for(lambda: failed_mount(api, "waits", "non-bound phase"), 30, what="FailedMount event")
    assert 'error processing PVC default/late: PVC default/late has non-bound phase ("Pending")' in message
    assert not running_in_api(api, "waits")

    bound = dict(pending, spec={**pending["spec"], "volumeName": "pv-late"}, status={"phase": "Bound"})
    api.create("persistentvolumes", persistent_volume("pv-late", pending, {"hostPath": {"path": str(tmp_path / "late"),
                                                                                       "type": "DirectoryOrCreate"}}))
    started = time.monotonic()
    api.replace("persistentvolumeclaims", bound)
    wait_for(lambda: running_in_api(api, "waits"), 30, what="waits Running once its claim is bound")
    print(f"\nclaim bound -> pod Running in the API: {(time.monotonic() - started) * 1000:.0f} ms")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"local": {"path": "/"}, "nodeAffinity": on_node("another-node")},
         'MountVolume.NodeAffinity check failed for volume "pv-refused" : no matching NodeSelectorTerms'),
        ({"local": {"path": "/dev/null"}, "volumeMode": "Block"},
         "volume data has volumeMode Block, but is specified in volumeMounts"),
        ({"nfs": {"server": "nas.invalid", "path": "/export"}},
         "PersistentVolume pv-refused: volume type nfs is not supported on this node"),
    ],
    ids=["other-node", "block", "nfs"],
)
def test_claims_this_node_cannot_mount_are_refused_with_the_kubelets_reason(agent, api, spec, message):
    source = {key: spec.pop(key) for key in ("local", "nfs") if key in spec}
    bind_by_hand(api, "refused", "pv-refused", source, **spec)
    agent.start()
    api.create("pods", api_pod("refused", volumes=[claim_volume("data", "refused")]))
    wait_for(lambda: failed_mount(api, "refused", message), 30, what=f"FailedMount: {message}")
    assert "CreateContainerConfigError" in str(main_status(api_get(api, "pods", "refused", "default")).get("state"))


def test_an_agent_restarted_offline_brings_a_claims_pod_back_on_the_same_directory(agent, api, containerd, tmp_path):
    data = tmp_path / "kept"
    bind_by_hand(api, "kept", "pv-kept", {"hostPath": {"path": str(data), "type": "DirectoryOrCreate"}})
    agent.start()
    uid = api.create("pods", api_pod("keeper", "echo start >> /mnt/data/starts; exec sleep 3600",
                                     volumes=[claim_volume("data", "kept")]))["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "keeper"), 60, what="keeper Running")
    cached = sorted(filename_to_key(p.name) for p in (agent.root_dir / "cache" / "objects").glob("*.ckpt"))
    assert cached == ["PersistentVolume//pv-kept", "PersistentVolumeClaim/default/kept"]

    api.go_down()
    agent.kill9()
    remove_pod_from_runtime(containerd.endpoint, uid)  # a reboot takes the containers away
    agent.start()
    wait_for(lambda: running_locally(agent, "keeper") and (data / "starts").read_text() == "start\nstart\n", 60,
             what="keeper recreated offline on the same directory")
