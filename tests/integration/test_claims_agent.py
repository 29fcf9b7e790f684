"""PersistentVolumeClaims end to end: the real agent, the API server double and the private containerd. Claims bound
by hand to hostPath and `local` volumes, a claim that waits while Pending, the kubelet's refusals, and a pod brought
back on the same directory by an agent killed and restarted while the API server is down.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from edgelet.util.checkpoint import filename_to_key
from edgelet.volumes.mountutil import is_mount_point
from tests.helpers import wait_for
from tests.integration.cluster_harness import (
    NODE,
    api_get,
    api_pod,
    bind_by_hand,
    claim,
    claim_volume,
    failed_mount,
    main_status,
    on_node,
    persistent_volume,
    remove_pod_from_runtime,
    running_in_api,
    running_locally,
)

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(cluster_node):
    """This module's agent is a cluster node."""
    return cluster_node


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
    assert is_mount_point(os.path.realpath(mount_point))  # a bind mount: same device, so os.path.ismount cannot tell
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

    api.create("persistentvolumes", persistent_volume("pv-late", pending, {"hostPath": {"path": str(tmp_path / "late"),
                                                                                       "type": "DirectoryOrCreate"}}))
    started = time.monotonic()
    # What the PV controller does: the claim's volumeName, then its status.
    api.patch("persistentvolumeclaims", "late", {"spec": {"volumeName": "pv-late"}}, namespace="default")
    api.patch("persistentvolumeclaims", "late", {"status": {"phase": "Bound"}}, namespace="default",
              subresource="status")
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
    wait_for(lambda: "CreateContainerConfigError" in str(main_status(api_get(api, "pods", "refused", "default"))),
             30, what="the container waiting with the reason")


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


def test_what_a_claim_adds_to_a_pod_start(agent, api, tmp_path):
    """Pods started one after another, alternately without and with a claim of their own: the claim's API calls
    (the claim and its volume, once) and the time from create to Running in the API, printed for the issue note."""
    agent.start()
    api.create("pods", api_pod("warm-up"))
    wait_for(lambda: running_in_api(api, "warm-up"), 60, what="warm-up Running")
    timings: dict[bool, list[float]] = {False: [], True: []}
    calls: dict[bool, list[int]] = {False: [], True: []}
    for index in range(4):
        for with_claim in (False, True):
            name = f"{'claimed' if with_claim else 'plain'}-{index}"
            volumes = None
            if with_claim:
                bind_by_hand(api, name, f"pv-{name}", {"hostPath": {"path": str(tmp_path / name),
                                                                    "type": "DirectoryOrCreate"}})
                volumes = [claim_volume("data", name)]
            before = len(api.requests)
            started = time.monotonic()
            api.create("pods", api_pod(name, volumes=volumes))
            wait_for(lambda name=name: running_in_api(api, name), 60, interval=0.02, what=f"{name} Running")
            timings[with_claim].append(time.monotonic() - started)
            reads = [r.path for r in api.requests[before:] if r.method == "GET" and "persistentvolume" in r.path]
            assert set(reads) == ({f"/api/v1/namespaces/default/persistentvolumeclaims/{name}",
                                   f"/api/v1/persistentvolumes/pv-{name}"} if with_claim else set())
            calls[with_claim].append(len(reads))
    # A second pod on a claim already read: nothing more is asked.
    before = len(api.requests)
    api.create("pods", api_pod("claimed-again", volumes=[claim_volume("data", "claimed-0")]))
    wait_for(lambda: running_in_api(api, "claimed-again"), 60, what="claimed-again Running")
    assert not [r for r in api.requests[before:] if "persistentvolume" in r.path]
    median = {key: sorted(values)[len(values) // 2] * 1000 for key, values in timings.items()}
    print(f"\npod create -> Running in the API (median of 4): without a claim {median[False]:.0f} ms, with a "
          f"hostPath claim {median[True]:.0f} ms; GETs of claim and volume per new claim: {calls[True]}, "
          "for a second pod on a claim: 0")


def test_a_full_local_volume_is_the_pods_affair(agent, api, tmp_path):
    """A local volume on a 1 MiB tmpfs that its pod fills: the agent goes on (a new pod starts, the full pod is
    restarted and reports as usual), and the data written stays."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        bind_by_hand(api, "small", "pv-small", {"local": {"path": str(disk)}}, nodeAffinity=on_node(NODE))
        agent.start()
        api.create("pods", api_pod("filler", "dd if=/dev/zero of=/mnt/data/fill bs=64k 2>/dev/null; "
                                             "echo filled; exec sleep 3600", volumes=[claim_volume("data", "small")]))
        wait_for(lambda: running_in_api(api, "filler") and "filled" in logs(agent, "filler"), 60, what="filler full")
        assert os.statvfs(disk).f_bavail == 0
        api.create("pods", api_pod("after"))
        wait_for(lambda: running_in_api(api, "after"), 60, what="a pod started after the volume filled")
        assert running_in_api(api, "filler")
    finally:
        agent.stop()
        subprocess.run(["umount", "-l", str(disk)], check=False)
