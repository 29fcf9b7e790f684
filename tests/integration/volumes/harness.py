"""The volume tests' pod, objects and runtime steps; their fixtures (`root`, `store`, `manager`) are in this
directory's conftest.py."""

from __future__ import annotations

import base64
import os

from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.volumes.mountutil import mounts_under, read_mounts

UID = "0a1b2c3d-0000-4000-8000-000000000001"


def volume_pod(volumes, containers=(), **spec):
    return {"metadata": {"name": "web", "namespace": "default", "uid": UID},
            "spec": {"volumes": volumes, "containers": list(containers) or [{"name": "app"}], **spec}}


def mount_at(path):
    matches = [m for m in read_mounts() if m.mount_point == path]
    return matches[-1] if matches else None


def secret_object(name, **data):
    return {"kind": "Secret", "metadata": {"name": name, "namespace": "default"},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def sandbox_config_for(manager):
    """The test pod's sandbox on the pod network, logging under its pod directory."""
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", uid=UID, namespace="default"), hostname="web",
        log_directory=os.path.join(manager.pod_dir(UID), "logs"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.POD))))


async def remove_pod(cri, manager, sandbox_id, container_id):
    """The container and sandbox gone from the runtime, the pod's volumes torn down with nothing left mounted."""
    await cri.remove_container(container_id)
    await cri.stop_pod_sandbox(sandbox_id)
    await cri.remove_pod_sandbox(sandbox_id)
    await manager.teardown_pod(UID)
    assert not mounts_under(manager.pods_dir)
