"""Cluster mode end to end: the real agent against the API server double and the private containerd.

Registration and the Lease heartbeat, an API pod's way to Running and back into the API, quiet resyncs
(no status writes while nothing changes), the final delete of a deleted pod, mirror pods of static pods,
and the jittered reconnect. What other cluster suites share with it is in cluster_harness.py.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import free_port
from tests.integration.cluster_harness import (
    NODE,
    RESYNC,
    api_get,
    api_pod,
    cluster_agent,
    lease_renew_time,
    main_status,
    running_container_ids,
    running_in_api,
    status_patches,
    unmount_below,
    wait_lease_renewed,
)
from tests.integration.cri_harness import runtime_objects
from tests.kubeapi_double import ApiServerDouble

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(cluster_node):
    """This module's agent is a cluster node."""
    return cluster_node


# -- tests -----------------------------------------------------------------------------------------------


def test_registration_heartbeat_and_pod_status_round_trip(agent, api, containerd):
    agent.start()
    # Registered at once (Ready False while the runtime is checked), Ready once the runtime answered.
    node = wait_for(lambda: (n := api_get(api, "nodes", NODE)) and _conditions(n).get("Ready") == "True" and n, 20,
                    what="node registered and Ready")
    assert _conditions(node) == {"Ready": "True", "MemoryPressure": "False", "DiskPressure": "False",
                                 "PIDPressure": "False"}
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    first = wait_for(lambda: lease_renew_time(api), 10, what="lease created")
    assert wait_lease_renewed(api) > first
    lease = api.get("leases", NODE, "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == NODE and lease["spec"]["leaseDurationSeconds"] == 4
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    created_at = time.monotonic()
    created = api.create("pods", api_pod("web"))
    pod = wait_for(lambda: running_in_api(api, "web"), 30, what="web Running in the API")
    to_running = time.monotonic() - created_at
    uid = created["metadata"]["uid"]
    (container_id,) = running_container_ids(containerd.endpoint, uid)
    assert main_status(pod)["containerID"] == f"containerd://{container_id}"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert pod["status"]["hostIP"] and pod["status"]["startTime"]
    print(f"\npod created in the API -> Running in the API: {to_running * 1000:.0f} ms "
          f"({status_patches(api, 'web')} status PATCHes)")

    # Quiet: once the status has settled, several resync periods pass without a single write.
    wait_for(lambda: _settled(api, "web"), 20, interval=0.2, what="status settled")
    before = status_patches(api, "web")
    quiet_from = time.monotonic()
    time.sleep(RESYNC * 4.5)
    assert status_patches(api, "web") == before, "status written although nothing changed"
    # Not even read: the resync compares with the watch's copy.
    reads = [r for r in api.requests if r.time >= quiet_from and r.path.startswith("/api/v1/namespaces/default/pods/")]
    assert reads == []
    assert api.panics == []


def _conditions(node: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}


def _settled(api: ApiServerDouble, name: str, quiet: float = 2.5 * RESYNC) -> bool:
    count = status_patches(api, name)
    time.sleep(quiet)
    return count == status_patches(api, name)


def test_deleted_pod_is_stopped_then_removed_from_the_api(agent, api, containerd):
    agent.start()
    uid = api.create("pods", api_pod("doomed", grace=30))["metadata"]["uid"]
    wait_for(lambda: running_in_api(api, "doomed"), 30, what="doomed Running")
    api.delete("pods", "doomed", "default", grace_period=1)  # graceful: sets deletionTimestamp
    assert api_get(api, "pods", "doomed", "default")["metadata"]["deletionTimestamp"]
    wait_for(lambda: api_get(api, "pods", "doomed", "default") is None, 30, what="final delete")
    assert runtime_objects(containerd.endpoint, uid) == ([], [])
    deletes = [r for r in api.requests if r.method == "DELETE" and r.path.endswith("/pods/doomed")]
    assert len(deletes) == 1


def test_static_pod_gets_a_mirror_pod(agent, api, containerd):
    agent.start()
    agent.write_manifest("static.yaml", busybox_manifest("static", "exec sleep 3600"))
    name = f"static-{NODE}"
    mirror = wait_for(lambda: running_in_api(api, name), 30, what="mirror pod Running in the API")
    annotations = mirror["metadata"]["annotations"]
    local = agent.pod("static")
    assert annotations["kubernetes.io/config.mirror"] == local["metadata"]["uid"]
    assert mirror["metadata"]["uid"] != local["metadata"]["uid"]
    node_uid = api.get("nodes", NODE)["metadata"]["uid"]
    assert mirror["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}]
    assert main_status(mirror)["containerID"] == main_status(local)["containerID"]
    # The mirror is never run as a pod of its own.
    assert len(running_container_ids(containerd.endpoint, local["metadata"]["uid"])) == 1
    assert running_container_ids(containerd.endpoint, mirror["metadata"]["uid"]) == []

    # An edited manifest is a new static pod: the mirror is replaced.
    agent.write_manifest("static.yaml", busybox_manifest("static", "exec sleep 3601"))
    replaced = wait_for(lambda: (m := running_in_api(api, name)) and m["metadata"]["uid"] != mirror["metadata"]["uid"]
                        and m, 30, what="mirror replaced")
    mirror_key = "kubernetes.io/config.mirror"
    assert replaced["metadata"]["annotations"][mirror_key] != annotations[mirror_key]

    (agent.manifest_dir / "static.yaml").unlink()
    wait_for(lambda: api_get(api, "pods", name, "default") is None, 30, what="mirror deleted")


def test_reconnect_is_jittered(tmp_path, containerd, api):
    # The first pod lists fail: the source retries on the reflector's schedule (a step of 0.8 s doubling, each
    # wait between the step and twice it), so the gaps between attempts are random draws in growing ranges,
    # not one fixed delay.
    api.fail_next(4, 503, path_prefix="/api/v1/pods", method="GET")
    agent = cluster_agent(tmp_path, containerd.endpoint, api)
    agent.start()
    try:
        wait_for(lambda: len(_pod_lists(api)) >= 5, 40, interval=0.1, what="five pod list attempts")
    finally:
        agent.stop()
    times = _pod_lists(api)[:5]
    gaps = [b - a for a, b in zip(times, times[1:])]
    steps = [0.8, 1.6, 3.2, 6.4]
    assert all(step <= gap <= 2 * step + 0.5 for gap, step in zip(gaps, steps)), gaps
    assert len({round(gap / step, 2) for gap, step in zip(gaps, steps)}) > 1, f"reconnect gaps look fixed: {gaps}"
    print(f"\nreconnect gaps (steps {steps}): {[round(g, 2) for g in gaps]}")


def _pod_lists(api: ApiServerDouble) -> list[float]:
    return [r.time for r in api.requests
            if r.method == "GET" and r.path == "/api/v1/pods" and r.query.get("watch") not in ("true", "1")]



def test_a_forbidden_mirror_pod_holds_up_nothing_and_the_agent_stays_healthy(tmp_path, containerd, api):
    port = free_port()
    agent = cluster_agent(tmp_path, containerd.endpoint, api, server_address=f"127.0.0.1:{port}")
    agent.start()
    try:
        # NodeRestriction refuses a mirror pod that references a ConfigMap (the static pod itself may run).
        volumes = ("\n          volumes:\n          - name: settings\n"
                   "            configMap: {name: settings, optional: true}\n")
        agent.write_manifest("restricted.yaml", busybox_manifest("restricted", "exec sleep 3600") + volumes)
        api.create("pods", api_pod("bystander"))
        wait_for(lambda: running_in_api(api, "bystander"), 30, what="bystander Running in the API")
        wait_for(lambda: api.write_count("POST", "/api/v1/namespaces/default/pods") >= 3, 20, what="mirror retries")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?verbose", timeout=5) as reply:
            assert reply.status == 200 and "[+]apisync ok" in reply.read().decode()
        reports = [line for line in agent.log_text().splitlines() if "refuses its mirror pod" in line]
        assert len(reports) == 1 and f"default/restricted-{NODE}" in reports[0] and "configmaps" in reports[0]
        assert api_get(api, "pods", f"restricted-{NODE}", "default") is None
    finally:
        agent.stop()
        unmount_below(tmp_path)
