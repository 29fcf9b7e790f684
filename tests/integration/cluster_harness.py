"""Cluster mode helpers for the suites that run the real agent against the API server double: its config, the
pods the API hands it, and reading their state back from the API, the agent and the runtime. The fixtures (`api`,
`cluster_node`) are in tests/integration/conftest.py."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path
from typing import Any

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess
from tests.integration.cri_harness import runtime_objects
from tests.kubeapi_double import ApiServerDouble, StatusError
from tests.runtime_cleanup import empty_runtime_at

NODE = "testnode"
IMAGE = "docker.io/library/busybox:local"
# Short periods keep the tests fast; the ratios are the kubelet's (renew every 1/4 of the lease).
CLUSTER_TOML = """
[cluster]
kubeconfig = "{kubeconfig}"
lease_duration = "4s"
lease_renew_interval = "1s"
node_status_update_frequency = "1s"
node_status_report_frequency = "1m"
status_resync = "1s"
"""
RESYNC = 1.0


def cluster_agent(workdir: Path, endpoint: str, api: ApiServerDouble, *, server_address: str = "") -> AgentProcess:
    kubeconfig = api.write_kubeconfig(str(workdir / "kubeconfig"))
    # The kubelet API would listen on 0.0.0.0:10250 by default: a free loopback port keeps agents apart.
    toml = CLUSTER_TOML.format(kubeconfig=kubeconfig) + '\n[kubelet_api]\naddress = "127.0.0.1:0"\n'
    return AgentProcess(workdir, endpoint, node_name=NODE, extra_toml=toml, server_address=server_address)


def log_seconds_between(agent: AgentProcess, first: str, then: str, *, start_at: str = "") -> float:
    """Seconds between the agent's first log line containing `first` and the next containing `then`
    (searching after the last line containing `start_at`, if given)."""
    lines = agent.log_text().splitlines()
    if start_at:
        lines = lines[max(i for i, line in enumerate(lines) if start_at in line):]
    stamps = []
    for needle in (first, then):
        index, line = next((i, line) for i, line in enumerate(lines) if needle in line)
        stamps.append(datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"))
        lines = lines[index:]
    return (stamps[1] - stamps[0]).total_seconds()


def api_pod(name: str, command: str = "exec sleep 3600", *, volumes: list | None = None,
            env: list | None = None, grace: int = 1) -> dict[str, Any]:
    """A pod as the API server holds it after defaulting, bound to this node."""
    container: dict[str, Any] = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", command]}
    if env:
        container["env"] = env
    spec: dict[str, Any] = {"nodeName": NODE, "hostNetwork": True, "restartPolicy": "Always",
                            "terminationGracePeriodSeconds": grace, "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
        container["volumeMounts"] = [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in volumes]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def api_get(api: ApiServerDouble, resource: str, name: str, namespace: str | None = None) -> dict | None:
    try:
        return api.get(resource, name, namespace)
    except StatusError as e:
        if e.code == 404:
            return None
        raise


def main_status(pod: dict | None) -> dict:
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == "main":
            return status
    return {}


def running_in_api(api: ApiServerDouble, name: str) -> dict | None:
    """The API pod once its status says Running with the main container running, else None."""
    pod = api_get(api, "pods", name, "default")
    if pod and pod["status"].get("phase") == "Running" and "running" in (main_status(pod).get("state") or {}):
        return pod
    return None


def running_locally(agent: AgentProcess, name: str) -> dict | None:
    """The pod as `edgelet pods` shows it, once Running with its main container running."""
    pod = agent.pods().get(name)
    if pod and pod["status"].get("phase") == "Running" and "running" in (main_status(pod).get("state") or {}):
        return pod
    return None


def status_patches(api: ApiServerDouble, name: str) -> int:
    return api.write_count("PATCH", f"/api/v1/namespaces/default/pods/{name}/status")


def lease_renew_time(api: ApiServerDouble) -> str | None:
    lease = api_get(api, "leases", NODE, "kube-node-lease")
    return lease["spec"]["renewTime"] if lease else None


def wait_lease_renewed(api: ApiServerDouble, timeout: float = 15) -> str:
    before = lease_renew_time(api)
    return wait_for(lambda: (now := lease_renew_time(api)) and now != before and now, timeout, what="lease renewal")


def running_container_ids(endpoint: str, pod_uid: str) -> list[str]:
    _, containers = runtime_objects(endpoint, pod_uid)
    return sorted(c.id for c in containers if c.state == pb.CONTAINER_RUNNING)


def remove_pod_from_runtime(endpoint: str, pod_uid: str) -> None:
    """What a crash, a reboot or an operator can do behind the agent's back."""
    empty_runtime_at(endpoint, selector={labels.POD_UID: pod_uid})


def unmount_below(directory: Path) -> None:
    """Secret volumes (tmpfs) rightly outlive a stopped agent; the test's directory goes only once they are
    unmounted."""
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    for point in sorted((p for p in points if p.startswith(f"{directory}/")), reverse=True):
        subprocess.run(["umount", point], check=False, capture_output=True)


def claim(name: str, volume: str = "") -> dict:
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec,
            "status": {"phase": "Bound" if volume else "Pending"}}


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
