"""Eviction signals from synthetic /proc and cgroup text: memory working set, filesystems, PIDs."""

import os

import pytest

from edgelet.eviction.signals import (
    Observation,
    filesystem_observations,
    memory_observation,
    parse_flat_keyed,
    parse_meminfo,
    pid_observation,
    tasks_in_use,
)
from edgelet.eviction.usage import ContainerUsage, PodUsage, working_set

MEMINFO = """\
MemTotal:        2000000 kB
MemFree:          300000 kB
MemAvailable:     900000 kB
Inactive(file):   400000 kB
HugePages_Total:       0
"""


def test_parse_meminfo_in_bytes():
    values = parse_meminfo(MEMINFO)
    assert values["MemTotal"] == 2_000_000 * 1024
    assert values["Inactive(file)"] == 400_000 * 1024
    assert values["HugePages_Total"] == 0  # no unit: a count, not kB


def test_parse_flat_keyed_skips_junk():
    assert parse_flat_keyed("cache 10\nrss 20\nbroken\ntotal_inactive_file 5\nx y\n") == {
        "cache": 10, "rss": 20, "total_inactive_file": 5}


KiB = 1024


@pytest.mark.parametrize("case, usage, stat, expected_available", [
    # capacity 2000000 KiB; working set = usage - total_inactive_file
    ("v1 root cgroup", 1_500_000 * KiB, {"total_inactive_file": 500_000 * KiB}, 1_000_000 * KiB),
    ("working set never negative", 100, {"total_inactive_file": 500}, 2_000_000 * KiB),
    # no root usage: MemTotal - MemFree - Inactive(file) = 1300000 KiB in use
    ("cgroup v2 or no memory controller: meminfo", None, None, 700_000 * KiB),
    ("v1 stat without the key: meminfo", 5, {"cache": 1}, 700_000 * KiB),
])
def test_memory_available(case, usage, stat, expected_available):
    observation = memory_observation(parse_meminfo(MEMINFO), usage, stat)
    assert observation == Observation(available=expected_available, capacity=2_000_000 * KiB)


def statvfs(frsize=4096, blocks=1000, bavail=100, files=500, ffree=50):
    return os.statvfs_result((frsize, frsize, blocks, bavail + 10, bavail, files, ffree, ffree, 0, 255))


def test_filesystem_observations_bytes_and_inodes():
    space, inodes = filesystem_observations(statvfs())
    assert space == Observation(available=100 * 4096, capacity=1000 * 4096)
    assert inodes == Observation(available=50, capacity=500)


def test_filesystem_without_inode_counts_has_no_inode_signal():
    _, inodes = filesystem_observations(statvfs(files=0, ffree=0))
    assert inodes is None


@pytest.mark.parametrize("pid_max, threads_max, tasks, expected", [
    (32768, 100000, 768, Observation(32000, 32768)),
    (4194304, 60000, 1000, Observation(59000, 60000)),  # the smaller limit wins
    (0, 1000, 10, Observation(990, 1000)),  # an unreadable limit is ignored
    (100, 100, 150, Observation(0, 100)),
])
def test_pid_observation(pid_max, threads_max, tasks, expected):
    assert pid_observation(pid_max, threads_max, tasks) == expected


@pytest.mark.parametrize("text, expected", [("0.10 0.20 0.30 2/345 6789\n", 345), ("garbage", 0)])
def test_tasks_in_use(text, expected):
    assert tasks_in_use(text) == expected


@pytest.mark.parametrize("usage, stat, expected", [
    (1000, {"total_inactive_file": 300}, 700),  # cgroup v1
    (1000, {"inactive_file": 100}, 900),  # cgroup v2
    (1000, {}, 1000),
    (100, {"inactive_file": 300}, 0),
])
def test_container_working_set(usage, stat, expected):
    assert working_set(usage, stat) == expected


def test_pod_usage_sums_what_is_known():
    usage = PodUsage({"a": ContainerUsage(memory=10, disk=5, inodes=2, processes=3),
                      "b": ContainerUsage(memory=None, disk=7, inodes=1, processes=None)},
                     volume_bytes=100, volume_inodes=4)
    assert (usage.memory, usage.disk, usage.inodes, usage.processes) == (10, 112, 7, 3)
    assert PodUsage({"a": ContainerUsage()}).memory is None  # running, but not measurable
    assert PodUsage({}).memory == 0 and PodUsage({}).processes == 0  # nothing running
