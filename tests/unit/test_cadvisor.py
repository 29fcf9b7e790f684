"""/metrics/cadvisor's pieces without a runtime: cgroup v1 and v2 files read into usage, usage written as cAdvisor's
series (read back by prometheus_client's parser), /proc parsers, and the pod cgroup tree found on disk."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgelet.cadvisor.cgroupfs import (
    CgroupReader,
    container_id_of,
    device_names,
    parse_v1_io_service_bytes,
    parse_v2_io_stat,
    v1_usage,
    v2_usage,
    weight_to_shares,
)
from edgelet.cadvisor.procfs import device_of, mount_sources
from edgelet.cadvisor.series import FAMILIES, Identity, Machine, Usage, cgroup_samples, machine_samples, render

V2_FILES = {
    "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 7\n"
                "throttled_usec 1500000\n",
    "cpu.max": "50000 100000\n",
    "cpu.weight": "100\n",
    "memory.current": "10485760\n",
    "memory.stat": "anon 4194304\nfile 6291456\nfile_mapped 1048576\ninactive_file 2097152\n",
    "memory.max": "max\n",
    "memory.swap.current": "0\n",
    "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    "io.stat": "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n",
}
V1_FILES = {
    "cpuacct/cpuacct.usage": "2500000000\n",
    "cpuacct/cpuacct.stat": "user 200\nsystem 50\n",
    "cpu/cpu.stat": "nr_periods 40\nnr_throttled 7\nthrottled_time 1500000000\n",
    "cpu/cpu.cfs_quota_us": "-1\n",
    "cpu/cpu.cfs_period_us": "100000\n",
    "cpu/cpu.shares": "2\n",
    "memory/memory.usage_in_bytes": "10485760\n",
    "memory/memory.stat": "cache 1\nrss 1\ntotal_cache 6291456\ntotal_rss 4194304\ntotal_mapped_file 1048576\n"
                          "total_swap 0\ntotal_inactive_file 2097152\n",
    "memory/memory.limit_in_bytes": "9223372036854771712\n",
    "memory/memory.failcnt": "3\n",
    "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    "blkio/blkio.throttle.io_service_bytes_recursive": "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Total 12288\n"
                                                       "Total 12288\n",
}
EXPECTED = dict(cpu_seconds=2.5, cpu_user_seconds=2.0, cpu_system_seconds=0.5, cfs_periods=40.0,
                cfs_throttled_periods=7.0, cfs_throttled_seconds=1.5, memory_usage=10485760.0,
                memory_working_set=8388608.0, memory_rss=4194304.0, memory_cache=6291456.0,
                memory_mapped_file=1048576.0, memory_swap=0.0, oom_events=1.0, cpu_period=100000.0,
                memory_limit=0.0, io=[("8:0", 4096.0, 8192.0)])


@pytest.mark.parametrize("read, files, particular", [
    (v2_usage, V2_FILES, dict(cpu_quota=50000.0, cpu_shares=2.0 + (99 * 262142) // 9999, memory_failcnt=None)),
    (v1_usage, V1_FILES, dict(cpu_quota=None, cpu_shares=2.0, memory_failcnt=3.0)),
])
def test_cgroup_files_read_as_cadvisor_reads_them(read, files, particular):
    usage = read(files)
    for attribute, value in {**EXPECTED, **particular}.items():
        assert getattr(usage, attribute) == pytest.approx(value) if isinstance(value, float) else \
            getattr(usage, attribute) == value, attribute


@pytest.mark.parametrize("read", [v1_usage, v2_usage])
def test_missing_files_leave_their_figures_out(read):
    assert read({}) == Usage()


def test_io_parsers_and_weights():
    assert parse_v2_io_stat("8:0 rbytes=1 wbytes=2\n253:1 rbytes=3 wbytes=4 rios=1\n") == {"8:0": (1, 2),
                                                                                           "253:1": (3, 4)}
    assert parse_v1_io_service_bytes("8:0 Read 1\n8:0 Write 2\n8:16 Read 5\nTotal 8\n") == {"8:0": (1, 2),
                                                                                           "8:16": (5, 0)}
    assert weight_to_shares(1) == 2 and weight_to_shares(10000) == 262144


@pytest.mark.parametrize("component, container_id", [
    ("0123abcd", "0123abcd"),
    ("cri-containerd-0123abcd.scope", "0123abcd"),
])
def test_container_id_of(component, container_id):
    assert container_id_of(component) == container_id


def test_usage_merge_fills_only_gaps():
    cri = Usage(cpu_seconds=1.0, memory_working_set=5.0)
    merged = cri.merge(Usage(cpu_seconds=9.0, memory_working_set=9.0, memory_cache=3.0, io=[("8:0", 1.0, 2.0)]))
    assert (merged.cpu_seconds, merged.memory_working_set, merged.memory_cache, merged.io) == (1.0, 5.0, 3.0,
                                                                                               [("8:0", 1.0, 2.0)])


def parse(text: bytes) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text.decode())}


def test_exposition_has_cadvisor_names_types_and_labels():
    container = Identity("web-1", "default", "/kubepods/besteffort/podu1/c1", "nginx", "docker.io/library/nginx:1",
                         "c1")
    pod = Identity("web-1", "default", "/kubepods/besteffort/podu1")
    usage = Usage(cpu_seconds=2.5, memory_working_set=8.0, memory_rss=4.0, memory_usage=10.0, memory_limit=0.0,
                  cfs_throttled_periods=7.0, start_time=1.7e9, fs_usage=[("/dev/sda1", 4096.0)],
                  io=[("/dev/sda", 1.0, 2.0)])
    pod_usage = Usage(cpu_seconds=3.0, network=[("eth0", 100.0, 0.0, 200.0, 1.0)])
    text = render([*cgroup_samples(container, usage, 1.8e9), *cgroup_samples(pod, pod_usage, 1.8e9),
                   *machine_samples(Machine(4, 8 << 30, "b", "m", "s")), ("container_scrape_error", (), 0.0)])
    families = parse(text)
    # prometheus_client drops _total from a counter family's name; the samples keep it
    assert families["container_cpu_usage_seconds"].type == "counter"
    assert families["container_memory_working_set_bytes"].type == "gauge"
    cpu = {s.labels["container"]: s for s in families["container_cpu_usage_seconds"].samples}
    assert cpu["nginx"].name == "container_cpu_usage_seconds_total"
    assert cpu["nginx"].labels == {"container": "nginx", "cpu": "total", "id": "/kubepods/besteffort/podu1/c1",
                                   "image": "docker.io/library/nginx:1", "name": "c1", "namespace": "default",
                                   "pod": "web-1"}
    assert cpu[""].labels == {"container": "", "cpu": "total", "id": "/kubepods/besteffort/podu1", "image": "",
                              "name": "", "namespace": "default", "pod": "web-1"} and cpu[""].value == 3.0
    network = families["container_network_receive_bytes"].samples
    assert [(s.labels["interface"], s.labels["container"], s.value) for s in network] == [("eth0", "", 100.0)]
    assert families["container_fs_usage_bytes"].samples[0].labels["device"] == "/dev/sda1"
    assert families["container_fs_writes_bytes"].samples[0].value == 2.0
    assert families["machine_cpu_cores"].samples[0].labels == {"boot_id": "b", "machine_id": "m", "system_uuid": "s"}
    assert families["machine_memory_bytes"].samples[0].value == 8 << 30
    # a figure the node could not give is left out, not written as zero
    assert [s.labels["container"] for s in families["container_memory_rss"].samples] == ["nginx"]
    assert "container_spec_cpu_quota" not in families
    # each family once, in cAdvisor's order
    names = [line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE")]
    assert names == [name for name in FAMILIES if name in names] and len(names) == len(set(names))


def test_label_values_are_escaped():
    text = render(cgroup_samples(Identity('p"1', "ns\\x"), Usage(cpu_seconds=1.0), 0.0)).decode()
    assert 'pod="p\\"1"' in text and 'namespace="ns\\\\x"' in text
    assert parse(text.encode())["container_cpu_usage_seconds"].samples[0].labels["pod"] == 'p"1'


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:26 / /var/lib/containerd rw - xfs /dev/sdb1 rw
31 22 0:27 / /run rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize("path, device", [
    ("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", "/dev/sdb1"),
    ("/var/lib/containerdx", "/dev/sda1"),
    ("/", "/dev/sda1"),
])
def test_device_of_a_path(path, device):
    assert device_of(path, mount_sources(MOUNTINFO)) == device


def test_device_names_from_sysfs():
    files = {"/sys/dev/block/8:0/uevent": "MAJOR=8\nMINOR=0\nDEVNAME=sda\nDEVTYPE=disk\n"}

    def read(path):
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    assert device_names(["8:0", "9:9"], read) == {"8:0": "/dev/sda", "9:9": "9:9"}


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_reader_finds_pod_cgroups_in_both_spellings(tmp_path, version):
    def cgroup(path, files):
        for name, text in files.items():
            target = tmp_path / (path.lstrip("/") if version == "v2" else f"{name.split('/')[0]}{path}")
            target.mkdir(parents=True, exist_ok=True)
            (target / name.split("/")[-1]).write_text(text)

    if version == "v2":
        (tmp_path / "cgroup.controllers").write_text("cpu memory io\n")
    files = V2_FILES if version == "v2" else V1_FILES
    cgroup("/kubepods/besteffort/pod1111-2222", files)
    cgroup("/kubepods/besteffort/pod1111-2222/abcdef", files)
    cgroup("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3333_4444.slice", files)
    cgroup("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3333_4444.slice/"
           "cri-containerd-fedcba.scope", files)
    reader = CgroupReader(str(tmp_path))
    pods = reader.pods()
    assert pods == {
        "1111-2222": ("/kubepods/besteffort/pod1111-2222", ["abcdef"]),
        "3333-4444": ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3333_4444.slice",
                      ["cri-containerd-fedcba.scope"]),
    }
    assert reader.usage("/kubepods/besteffort/pod1111-2222/abcdef").cpu_seconds == 2.5
    assert reader.usage("/kubepods/gone").cpu_seconds is None
