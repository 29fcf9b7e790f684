"""Pod cgroups on the real runtime and this machine's cgroupfs: a pod's container lives under
<root>/kubepods/burstable/pod<uid>, whose memory and CPU limits are the pod's, and the pod's cgroup goes with it,
from every hierarchy the runtime put the container in."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from edgelet.volumes.mountutil import read_mounts
from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess, is_running
from tests.integration.cri_harness import runtime_objects
from tests.runtime_cleanup import empty_runtime

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

CGROUP_FS = Path("/sys/fs/cgroup")
V1 = not (CGROUP_FS / "cgroup.controllers").exists()

LIMITED_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: limited
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: docker.io/library/busybox:local
      imagePullPolicy: Never
      command: ["sleep", "3600"]
      resources:
        requests: {cpu: 100m, memory: 32Mi}
        limits: {cpu: 500m, memory: 64Mi}
"""


def mounted_hierarchies() -> list[Path]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup, as the kernel lists its mounts."""
    return [Path(mount.mount_point) for mount in read_mounts()
            if mount.fstype in ("cgroup", "cgroup2") and Path(mount.mount_point).parent == CGROUP_FS]


def hierarchy_dirs(cgroup: str) -> list[Path]:
    """The cgroup's directory in every hierarchy (v1), or its one directory (v2)."""
    if not V1:
        return [CGROUP_FS / cgroup.lstrip("/")]
    return [hierarchy / cgroup.lstrip("/") for hierarchy in mounted_hierarchies()]


def controller_dir(controller: str, cgroup: str) -> Path:
    return (CGROUP_FS / controller if V1 else CGROUP_FS) / cgroup.lstrip("/")


def remove_tree(root: str) -> None:
    """The test's own cgroup root in every hierarchy, deepest first (cgroupfs removes a directory's control files
    with it)."""
    for top in hierarchy_dirs(root):
        if not top.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):
            try:
                os.rmdir(directory)
            except OSError:
                pass


@pytest.fixture
async def cgroup_root(cri):
    root = f"/edgelet-test-{uuid.uuid4().hex[:8]}"
    yield root
    # The containers first, whatever the test left running: a cgroup that still holds one cannot be removed.
    await empty_runtime(cri)
    remove_tree(root)


def test_a_pod_runs_in_its_cgroup_under_the_qos_tree_with_its_limits(tmp_path, containerd, cgroup_root):
    agent = AgentProcess(tmp_path, containerd.endpoint, extra_toml=f'\n[cgroups]\nroot = "{cgroup_root}"\n')
    agent.start()
    try:
        agent.write_manifest("limited.yaml", LIMITED_POD)
        wait_for(lambda: is_running(agent.pod("limited")), timeout=60, what="the pod running")
        burstable = f"{cgroup_root}/kubepods/burstable"
        (pod_dir,) = [entry.name for entry in controller_dir("memory", burstable).iterdir()
                      if entry.is_dir() and entry.name.startswith("pod")]
        pod_cgroup = f"{burstable}/{pod_dir}"
        _, containers = runtime_objects(containerd.endpoint, pod_dir[len("pod"):])
        (container,) = [c for c in containers if c.metadata.name == "main"]

        # The container's own cgroup is inside the pod's, and the container's processes are in it.
        procs = controller_dir("memory", f"{pod_cgroup}/{container.id}") / "cgroup.procs"
        assert procs.read_text().split(), f"no process in {procs}"
        if V1:
            assert controller_dir("memory", pod_cgroup).joinpath("memory.limit_in_bytes").read_text().strip() \
                == str(64 * 2**20)
            assert controller_dir("cpu", pod_cgroup).joinpath("cpu.cfs_quota_us").read_text().strip() == "50000"
            assert controller_dir("cpu", pod_cgroup).joinpath("cpu.shares").read_text().strip() == "102"
            assert controller_dir("cpu", f"{cgroup_root}/kubepods/besteffort").joinpath("cpu.shares") \
                .read_text().strip() == "2"
            kubepods_limit = int(controller_dir("memory", f"{cgroup_root}/kubepods")
                                 .joinpath("memory.limit_in_bytes").read_text())
            assert 0 < kubepods_limit < 2**62  # node allocatable, not the kernel's "unlimited"
            # The container's cgroup is in each hierarchy inside the pod's, which the agent made there first; the
            # kernel gave the pod's and the container's cpusets the QoS cgroup's CPUs as it made them.
            for directory in hierarchy_dirs(f"{pod_cgroup}/{container.id}"):
                assert directory.is_dir(), directory
            if controller_dir("cpuset", "/").is_dir():
                qos_cpus = controller_dir("cpuset", burstable).joinpath("cpuset.cpus").read_text().strip()
                assert qos_cpus
                for cgroup in (pod_cgroup, f"{pod_cgroup}/{container.id}"):
                    assert controller_dir("cpuset", cgroup).joinpath("cpuset.cpus").read_text().strip() == qos_cpus
                assert controller_dir("cpuset", burstable).joinpath("cgroup.clone_children").read_text().strip() \
                    == "1"
        else:
            assert controller_dir("", pod_cgroup).joinpath("memory.max").read_text().strip() == str(64 * 2**20)

        # Removed with its pod, at housekeeping, from every hierarchy.
        (agent.manifest_dir / "limited.yaml").unlink()
        wait_for(lambda: not any(directory.exists() for directory in hierarchy_dirs(pod_cgroup)), timeout=90,
                 what="the pod cgroup removed from every hierarchy")
    finally:
        agent.stop()
