"""The kubelet's cgroup layout: names in both drivers' spellings, the pod cgroup's settings, node allocatable, the
driver choice, and the files PodCgroups writes (into a directory standing in for /sys/fs/cgroup)."""

from __future__ import annotations

import os

import pytest

from edgelet.api import qos
from edgelet.cm import cgroups
from edgelet.cm.cgroups import Allocatable, CgroupResources
from edgelet.cm.podcgroups import CgroupError, PodCgroups, cpu_weight, driver_of, v1_hierarchies, v1_writes, v2_writes
from edgelet.config import CgroupsConfig
from edgelet.cri import CRIError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.nodestatus.setters import NodeInfo, Reserved, StatusInputs, set_capacity

UID = "6f1c2b3a-4d5e-4f60-8a9b-0c1d2e3f4a5b"
UNDERSCORED = UID.replace("-", "_")


@pytest.mark.parametrize("qos_class, root, cgroupfs, systemd", [
    (qos.GUARANTEED, "/", f"/kubepods/pod{UID}", f"/kubepods.slice/kubepods-pod{UNDERSCORED}.slice"),
    (qos.BURSTABLE, "/", f"/kubepods/burstable/pod{UID}",
     f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"),
    (qos.BEST_EFFORT, "/", f"/kubepods/besteffort/pod{UID}",
     f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice"),
    (qos.BURSTABLE, "/edge-node/", f"/edge-node/kubepods/burstable/pod{UID}",
     f"/edge_node.slice/edge_node-kubepods.slice/edge_node-kubepods-burstable.slice/"
     f"edge_node-kubepods-burstable-pod{UNDERSCORED}.slice"),
])
def test_pod_cgroup_names_in_both_spellings(qos_class, root, cgroupfs, systemd):
    name = cgroups.pod_name(UID, qos_class, root)
    assert cgroups.spell(name, cgroups.CGROUPFS) == cgroupfs
    assert cgroups.spell(name, cgroups.SYSTEMD) == systemd
    assert cgroups.pod_uid_of(cgroupfs.rsplit("/", 1)[1]) == UID
    assert cgroups.pod_uid_of(systemd.rsplit("/", 1)[1]) == UID


@pytest.mark.parametrize("component", ["burstable", "besteffort", "kubepods-burstable.slice", "pod", "cpu.shares"])
def test_other_entries_name_no_pod(component):
    assert cgroups.pod_uid_of(component) is None


def test_the_root_cgroup_spellings():
    assert cgroups.to_systemd(()) == "/" and cgroups.to_cgroupfs(()) == "/"
    assert cgroups.qos_names("/")[qos.GUARANTEED] == ("kubepods",)


def pod(*containers, init=(), overhead=None):
    spec = {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(containers)],
            "initContainers": [{"name": f"i{i}", **r} for i, r in enumerate(init)]}
    if overhead:
        spec["overhead"] = overhead
    return {"metadata": {"uid": UID}, "spec": spec}


LIMITED = {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}
GUARANTEED = {"limits": {"cpu": "1", "memory": "100Mi"}}
REQUEST_ONLY = {"requests": {"cpu": "100m", "memory": "32Mi"}}


@pytest.mark.parametrize("spec, expected", [
    # BestEffort: the minimum shares and nothing else.
    (pod({}), CgroupResources(cpu_shares=2)),
    # Guaranteed: shares, quota, period and memory from the limits (requests default to them).
    (pod(GUARANTEED, GUARANTEED), CgroupResources(cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000,
                                                   memory_limit=200 * 2**20)),
    # Burstable with every limit declared: the sums of the limits.
    (pod(LIMITED, LIMITED), CgroupResources(cpu_shares=512, cpu_quota=100_000, cpu_period=100_000,
                                             memory_limit=256 * 2**20)),
    # One container without limits: no quota and no memory limit, shares from the requests.
    (pod(LIMITED, REQUEST_ONLY), CgroupResources(cpu_shares=358)),
    # An init container larger than the app containers bounds the pod.
    (pod(LIMITED, init=[{"resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "2"}}}]),
     CgroupResources(cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000, memory_limit=2**30)),
    # The pod overhead adds to the requests and the limits.
    (pod(LIMITED, overhead={"cpu": "100m", "memory": "16Mi"}),
     CgroupResources(cpu_shares=358, cpu_quota=60_000, cpu_period=100_000, memory_limit=144 * 2**20)),
])
def test_pod_resources_as_resource_config_for_pod(spec, expected):
    assert cgroups.pod_resources(spec) == expected


def test_without_cfs_quota_a_guaranteed_pod_gets_no_quota():
    assert cgroups.pod_resources(pod(GUARANTEED), cpu_cfs_quota=False).cpu_quota == -1


def test_burstable_shares_count_only_burstable_pods():
    assert cgroups.burstable_shares([pod(LIMITED), pod(REQUEST_ONLY), pod(GUARANTEED), pod({})]) == 358
    assert cgroups.burstable_shares([]) == 2


@pytest.mark.parametrize("reserved, expected", [
    ((), Allocatable(4000, 8 * 2**30)),
    (({"cpu": "500m", "memory": "1Gi"}, {"cpu": "250m"}), Allocatable(3250, 7 * 2**30)),
    (({"cpu": "8", "memory": "16Gi"},), Allocatable(0, 0)),
])
def test_node_allocatable_is_capacity_less_what_is_reserved(reserved, expected):
    assert cgroups.node_allocatable(4, 8 * 2**30, *reserved) == expected


def test_the_node_reports_allocatable_less_reserved_and_eviction():
    node = {}
    set_capacity(node, StatusInputs(facts=NodeInfo(hostname="n", cpu_count=2, memory_bytes=4 * 2**30), now=0,
                                    reserved=Reserved(cpu_millis=300, memory_bytes=2**30)))
    assert node["status"]["capacity"]["cpu"] == "2"
    assert node["status"]["allocatable"]["cpu"] == "1700m"
    assert node["status"]["allocatable"]["memory"] == f"{(3 * 2**30 - 100 * 2**20) // 1024}Ki"


@pytest.mark.parametrize("answer, configured, driver, warns", [
    (None, "", "cgroupfs", False),
    (None, "systemd", "systemd", False),
    (pb.SYSTEMD, "", "systemd", False),
    (pb.CGROUPFS, "systemd", "cgroupfs", True),  # the runtime's word wins, with a warning
    (pb.SYSTEMD, "systemd", "systemd", False),
])
def test_the_driver_is_the_runtimes_then_the_configured_then_cgroupfs(answer, configured, driver, warns):
    chosen, warning = driver_of(answer, configured)
    assert chosen == driver and bool(warning) == warns


@pytest.mark.parametrize("shares, weight", [(2, 1), (1024, 39), (262144, 10000)])
def test_cpu_weight_from_shares(shares, weight):
    assert cpu_weight(shares) == weight


def test_files_written_for_v1_and_v2():
    limited = CgroupResources(cpu_shares=512, cpu_quota=50_000, cpu_period=100_000, memory_limit=2**27)
    assert v1_writes(limited) == [("cpu", "cpu.shares", "512"), ("cpu", "cpu.cfs_period_us", "100000"),
                                  ("cpu", "cpu.cfs_quota_us", "50000"), ("memory", "memory.limit_in_bytes",
                                                                          str(2**27))]
    assert v2_writes(limited) == [("cpu.weight", "20"), ("cpu.max", "50000 100000"), ("memory.max", str(2**27))]
    assert v2_writes(CgroupResources(cpu_quota=-1, cpu_period=100_000)) == [("cpu.max", "max 100000")]
    assert v1_writes(CgroupResources()) == []


class ConfigRuntime:
    def __init__(self, driver=None):
        self.driver = driver

    async def runtime_config(self):
        if self.driver is None:
            raise CRIError("runtime_config", "UNIMPLEMENTED", "unknown method RuntimeConfig")
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=self.driver))


def v1_tree(tmp_path):
    """cgroup v1 as a hybrid host mounts it, minus the kernel's files: the root cpuset's CPUs and memory nodes are
    the only ones there, as they are the only ones a new cpuset needs from its parent."""
    for controller in ("cpu", "memory", "pids", "cpuset", "freezer", "systemd", "unified"):
        (tmp_path / controller).mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    return str(tmp_path)


@pytest.mark.parametrize("entries, links, expected", [
    (["cpu", "memory", "pids"], {}, ["cpu", "memory", "pids"]),
    # Limited controllers first (the first one is where housekeeping lists pods), then the rest by name.
    (["blkio", "cpu", "cpuset", "memory", "pids", "systemd", "unified"], {},
     ["cpu", "memory", "pids", "blkio", "cpuset", "systemd", "unified"]),
    # cpu and cpuacct co-mounted, with a link for each name: one hierarchy, under the name of a limited controller.
    (["cpu,cpuacct", "memory"], {"cpu": "cpu,cpuacct", "cpuacct": "cpu,cpuacct"}, ["cpu", "memory"]),
    ([], {}, []),
])
def test_v1_hierarchies_once_each_limited_controllers_first(tmp_path, entries, links, expected):
    for entry in entries:
        (tmp_path / entry).mkdir()
    for link, target in links.items():
        (tmp_path / link).symlink_to(target)
    (tmp_path / "stray-file").write_text("")
    assert v1_hierarchies(str(tmp_path)) == [str(tmp_path / name) for name in expected]


async def test_pod_cgroups_on_a_v1_tree(tmp_path):
    fs = v1_tree(tmp_path)
    burstable_pod = pod(LIMITED, LIMITED)
    manager = PodCgroups(CgroupsConfig(), ConfigRuntime(), Allocatable(1500, 2**30),
                         active_pods=lambda: [burstable_pod], fs_root=fs)
    parent = await manager.parent_for(burstable_pod)
    assert parent == f"/kubepods/burstable/pod{UID}"

    def read(*parts: str) -> str:
        return tmp_path.joinpath(*parts).read_text()

    assert read("memory", "kubepods", "memory.limit_in_bytes") == str(2**30)
    assert read("cpu", "kubepods", "cpu.shares") == "1536"
    assert read("cpu", "kubepods", "besteffort", "cpu.shares") == "2"
    assert read("cpu", "kubepods", "burstable", "cpu.shares") == "512"
    assert read("memory", "kubepods", "burstable", f"pod{UID}", "memory.limit_in_bytes") == str(256 * 2**20)
    assert read("cpu", "kubepods", "burstable", f"pod{UID}", "cpu.cfs_quota_us") == "100000"
    # The pod cgroup is in every hierarchy, where the runtime would otherwise make it (and leave it behind).
    for hierarchy in ("pids", "cpuset", "freezer", "systemd", "unified"):
        assert os.path.isdir(tmp_path / hierarchy / "kubepods" / "burstable" / f"pod{UID}"), hierarchy
    # Each cpuset made gets its parent's CPUs and memory nodes; the QoS tree's clone their children.
    assert read("cpuset", "kubepods", "burstable", f"pod{UID}", "cpuset.cpus") == "0-3"
    assert read("cpuset", "kubepods", "burstable", f"pod{UID}", "cpuset.mems") == "0"
    for level in (("kubepods",), ("kubepods", "burstable"), ("kubepods", "besteffort")):
        assert read("cpuset", *level, "cgroup.clone_children") == "1"
    assert not (tmp_path / "cpuset" / "kubepods" / "burstable" / f"pod{UID}" / "cgroup.clone_children").exists()

    # Housekeeping finds the pod cgroups of every QoS class (their removal needs the real cgroupfs, where a
    # directory's control files go with it: tests/integration/test_pod_cgroups.py).
    other = "0a1b2c3d-0000-4000-8000-000000000000"
    await manager.parent_for(pod({}) | {"metadata": {"uid": other}})
    assert manager.pod_cgroups() == {UID: ("kubepods", "burstable", f"pod{UID}"),
                                     other: ("kubepods", "besteffort", f"pod{other}")}
    # A pod cgroup left in one hierarchy only (by an older agent, or a removal cut short) is found by a sweep of
    # every hierarchy, which an agent's first sweep is.
    leftover = "1b2c3d4e-0000-4000-8000-000000000000"
    (tmp_path / "freezer" / "kubepods" / "besteffort" / f"pod{leftover}").mkdir()
    assert leftover not in manager.pod_cgroups()
    assert manager.pod_cgroups(every_hierarchy=True)[leftover] == ("kubepods", "besteffort", f"pod{leftover}")

    # A removal cut short (here by the control files a stand-in directory keeps) leaves the pod cgroup in the first
    # hierarchy, where the next sweep finds it: it goes from the others first.
    assert await manager.remove_orphans(set()) == [leftover]
    pod_dir = ("kubepods", "burstable", f"pod{UID}")
    assert not (tmp_path / "unified").joinpath(*pod_dir).exists()
    assert (tmp_path / "cpu").joinpath(*pod_dir).exists()
    assert UID in manager.pod_cgroups()


async def test_without_per_qos_no_parent_and_nothing_written(tmp_path):
    fs = v1_tree(tmp_path)
    manager = PodCgroups(CgroupsConfig(per_qos=False), ConfigRuntime(), Allocatable(1000, 2**30), fs_root=fs)
    assert await manager.parent_for(pod(LIMITED)) == ""
    assert not os.path.exists(tmp_path / "memory" / "kubepods")


async def test_with_systemd_the_slice_is_named_and_the_runtime_makes_it(tmp_path):
    fs = v1_tree(tmp_path)
    manager = PodCgroups(CgroupsConfig(), ConfigRuntime(pb.SYSTEMD), Allocatable(1000, 2**30), fs_root=fs)
    assert await manager.parent_for(pod(LIMITED)) == (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice")
    assert not os.path.exists(tmp_path / "memory" / "kubepods")
    assert await manager.remove_orphans(set()) == []


async def test_a_v2_tree_enables_the_controllers_on_the_way_down(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids")
    manager = PodCgroups(CgroupsConfig(), ConfigRuntime(pb.CGROUPFS), Allocatable(1000, 2**30),
                         fs_root=str(tmp_path))
    await manager.parent_for(pod(GUARANTEED))
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (tmp_path / "kubepods" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (tmp_path / "kubepods" / "memory.max").read_text() == str(2**30)
    assert (tmp_path / "kubepods" / f"pod{UID}" / "cpu.max").read_text() == "100000 100000"
    assert (tmp_path / "kubepods" / f"pod{UID}" / "memory.max").read_text() == str(100 * 2**20)


async def test_a_pod_cgroup_made_only_in_part_is_in_the_first_hierarchy(tmp_path):
    fs = v1_tree(tmp_path)
    manager = PodCgroups(CgroupsConfig(), ConfigRuntime(), Allocatable(1000, 2**30), fs_root=fs)
    await manager.parent_for(pod({}) | {"metadata": {"uid": "0a1b2c3d-0000-4000-8000-000000000000"}})
    # The pod's cpuset cannot be filled (its parent's memory nodes unreadable): the pod's cgroup fails there, but
    # only after the first hierarchy has it.
    mems = tmp_path / "cpuset" / "kubepods" / "burstable" / "cpuset.mems"
    mems.unlink()
    mems.mkdir()
    with pytest.raises(CgroupError, match=f"/kubepods/burstable/pod{UID}"):
        await manager.parent_for(pod(LIMITED))
    assert (tmp_path / "cpu" / "kubepods" / "burstable" / f"pod{UID}").is_dir()
    assert UID in manager.pod_cgroups()
