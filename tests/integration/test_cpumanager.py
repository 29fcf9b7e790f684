"""The static CPU policy on the private containerd: a Guaranteed container with cpu "1" runs on one CPU of
its own, a shared container is moved off that CPU by the reconcile pass, and gets it back once released."""

from __future__ import annotations

import pytest

from edgelet.api.resources import linux_resources
from edgelet.cm.cpumanager import CPUManager, CPUStateStore
from edgelet.cm.topology import discover
from edgelet.kuberuntime.container import make_container_config
from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.pleg.generic import GenericPLEG
from edgelet.util.cpuset import format_cpuset, parse_cpuset
from tests.helpers import busybox_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


async def start_pod(cri, containerd, tmp_path, pod: dict, cpu_manager: CPUManager) -> str:
    """Creates the pod as the runtime manager does, with the cpuset the CPU manager hands out."""
    sandbox_config = make_sandbox_config(pod, 0, logs_root=str(tmp_path / "logs"))
    sandbox_id = await cri.run_pod_sandbox(sandbox_config)
    container = pod["spec"]["containers"][0]
    resources = linux_resources(pod, container)
    resources["cpuset_cpus"] = cpu_manager.cpuset_for(pod, container)
    config = make_container_config(pod, container, image_ref=containerd.image, restart_count=0, container_hash="0",
                                   env=[], command=container["command"], args=[], mounts=[], resources=resources)
    container_id = await cri.create_container(sandbox_id, config, sandbox_config)
    await cri.start_container(container_id)
    return container_id


async def allowed_cpus(cri, container_id: str, pid: str = "self") -> frozenset[int]:
    """Cpus_allowed_list of a process in the container: what the kernel lets it run on."""
    code, out, err = await cri.exec_sync(container_id, ["cat", f"/proc/{pid}/status"], 5)
    assert code == 0, err
    for line in out.decode().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpuset(line.split(":", 1)[1].strip())
    raise AssertionError(f"no Cpus_allowed_list in /proc/{pid}/status")


async def test_guaranteed_container_gets_an_exclusive_cpu_and_shared_containers_move_off_it(
        cri, containerd, tmp_path):
    topology = discover()
    if len(topology.all_cpus) < 2:
        pytest.skip("needs at least two CPUs")
    guaranteed = busybox_pod(name="pinned", resources={"requests": {"cpu": "1", "memory": "32Mi"},
                                        "limits": {"cpu": "1", "memory": "32Mi"}})
    shared = busybox_pod(name="shared", resources={})
    active = [shared]
    pleg = GenericPLEG(cri)
    cpu_manager = CPUManager("static", CPUStateStore(str(tmp_path / "state")), cri, active_pods=lambda: active,
                             runtime_status=pleg.get_status, topology=topology)
    cpu_manager.start()

    shared_id = await start_pod(cri, containerd, tmp_path, shared, cpu_manager)
    assert await allowed_cpus(cri, shared_id) == topology.all_cpus

    assert cpu_manager.admit(guaranteed) == (True, "", "")
    active.append(guaranteed)
    exclusive = parse_cpuset(cpu_manager.cpuset_for(guaranteed, guaranteed["spec"]["containers"][0]))
    assert len(exclusive) == 1
    pinned_id = await start_pod(cri, containerd, tmp_path, guaranteed, cpu_manager)
    assert await allowed_cpus(cri, pinned_id) == exclusive
    assert await allowed_cpus(cri, pinned_id, "1") == exclusive

    await pleg.relist()
    result = await cpu_manager.reconcile()
    assert shared_id in result.updated and not result.failed
    rest = topology.all_cpus - exclusive
    assert await allowed_cpus(cri, shared_id, "1") == rest  # the running process was moved, not only new ones
    assert await allowed_cpus(cri, shared_id) == rest
    cgroup_file = f"/sys/fs/cgroup/cpuset/k8s.io/{shared_id}/cpuset.cpus"
    try:
        assert parse_cpuset(open(cgroup_file).read()) == rest
    except FileNotFoundError:
        pass  # cgroup v2 or another layout: the kernel's view above is what counts

    # A second reconcile has nothing to do; releasing the pod gives its CPU back to the shared container.
    assert (await cpu_manager.reconcile()).updated == []
    await cri.stop_container(pinned_id, 0)
    active.remove(guaranteed)
    await pleg.relist()
    result = await cpu_manager.reconcile()
    assert result.released == [guaranteed["metadata"]["uid"]]
    assert shared_id in result.updated
    assert await allowed_cpus(cri, shared_id, "1") == topology.all_cpus
    assert format_cpuset(cpu_manager.state.default) == format_cpuset(topology.all_cpus)
