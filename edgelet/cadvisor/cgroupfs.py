"""A cgroup's usage from its files, cgroup v1 (a directory per controller) and v2 (one tree), as cAdvisor reads
them: the parsers are pure; `read_usage` and `find_pod_cgroups` are the I/O.

v2: cpu.stat, cpu.max, cpu.weight, memory.current, memory.stat, memory.max, memory.swap.current, memory.events,
io.stat. v1: cpuacct.usage, cpuacct.stat, cpu.stat, cpu.cfs_quota_us, cpu.cfs_period_us, cpu.shares,
memory.usage_in_bytes, memory.stat, memory.limit_in_bytes, memory.failcnt, memory.oom_control,
blkio.throttle.io_service_bytes_recursive. The working set is usage less inactive file pages, as cAdvisor has it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from edgelet.cm import cgroups

from .series import Usage

CGROUP_FS = "/sys/fs/cgroup"
# A v1 limit at or above this is the kernel's "no limit" (PAGE_COUNTER_MAX rounded to pages).
_V1_UNLIMITED = 1 << 62
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_flat_keyed(text: str) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.stat, memory.events, cpuacct.stat, memory.oom_control)."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value)
        except ValueError:
            continue
    return values


def parse_v2_io_stat(text: str) -> dict[str, tuple[int, int]]:
    """io.stat: `<major>:<minor> rbytes=.. wbytes=.. ...` -> {device number: (read bytes, written bytes)}."""
    devices = {}
    for line in text.splitlines():
        number, *pairs = line.split()
        fields = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            devices[number] = (int(fields.get("rbytes", 0)), int(fields.get("wbytes", 0)))
        except ValueError:
            continue
    return devices


def parse_v1_io_service_bytes(text: str) -> dict[str, tuple[int, int]]:
    """blkio.throttle.io_service_bytes: `<major>:<minor> Read|Write|... <bytes>` lines and a `Total` line."""
    devices: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[1] not in ("Read", "Write"):
            continue
        entry = devices.setdefault(parts[0], [0, 0])
        entry[0 if parts[1] == "Read" else 1] += int(parts[2])
    return {number: (read, written) for number, (read, written) in devices.items()}


def weight_to_shares(weight: int) -> int:
    """cpu.weight back to v1 shares, as cAdvisor and runc convert them."""
    return 2 + ((weight - 1) * 262142) // 9999


def v2_usage(files: Mapping[str, str]) -> Usage:
    """The usage of a v2 cgroup from its files' text (a file missing from `files` leaves its figures out)."""
    usage = Usage()
    if "cpu.stat" in files:
        cpu = parse_flat_keyed(files["cpu.stat"])
        usage.cpu_seconds = _scaled(cpu.get("usage_usec"), 1e-6)
        usage.cpu_user_seconds = _scaled(cpu.get("user_usec"), 1e-6)
        usage.cpu_system_seconds = _scaled(cpu.get("system_usec"), 1e-6)
        usage.cfs_periods = _scaled(cpu.get("nr_periods"), 1)
        usage.cfs_throttled_periods = _scaled(cpu.get("nr_throttled"), 1)
        usage.cfs_throttled_seconds = _scaled(cpu.get("throttled_usec"), 1e-6)
    if "cpu.max" in files:
        quota, _, period = files["cpu.max"].strip().partition(" ")
        usage.cpu_period = float(period) if period.isdigit() else None
        usage.cpu_quota = float(quota) if quota.isdigit() else None
    if files.get("cpu.weight", "").strip().isdigit():
        usage.cpu_shares = float(weight_to_shares(int(files["cpu.weight"])))
    _memory(usage, files.get("memory.current"), files.get("memory.stat"), _V2_MEMORY_STAT)
    if "memory.max" in files:
        limit = files["memory.max"].strip()
        usage.memory_limit = float(limit) if limit.isdigit() else 0.0
    if files.get("memory.swap.current", "").strip().isdigit():
        usage.memory_swap = float(files["memory.swap.current"])
    if "memory.events" in files:
        usage.oom_events = _scaled(parse_flat_keyed(files["memory.events"]).get("oom_kill"), 1)
    if "io.stat" in files:
        usage.io = [(number, float(read), float(written))
                    for number, (read, written) in sorted(parse_v2_io_stat(files["io.stat"]).items())]
    return usage


def v1_usage(files: Mapping[str, str]) -> Usage:
    """The usage of a v1 cgroup from its files' text, keyed by `<controller>/<file>`."""
    usage = Usage()
    if files.get("cpuacct/cpuacct.usage", "").strip().isdigit():
        usage.cpu_seconds = int(files["cpuacct/cpuacct.usage"]) / 1e9
    if "cpuacct/cpuacct.stat" in files:
        ticks = parse_flat_keyed(files["cpuacct/cpuacct.stat"])
        usage.cpu_user_seconds = _scaled(ticks.get("user"), 1 / _USER_HZ)
        usage.cpu_system_seconds = _scaled(ticks.get("system"), 1 / _USER_HZ)
    if "cpu/cpu.stat" in files:
        cpu = parse_flat_keyed(files["cpu/cpu.stat"])
        usage.cfs_periods = _scaled(cpu.get("nr_periods"), 1)
        usage.cfs_throttled_periods = _scaled(cpu.get("nr_throttled"), 1)
        usage.cfs_throttled_seconds = _scaled(cpu.get("throttled_time"), 1e-9)
    period = files.get("cpu/cpu.cfs_period_us", "").strip()
    usage.cpu_period = float(period) if period.isdigit() else None
    quota = files.get("cpu/cpu.cfs_quota_us", "").strip()
    usage.cpu_quota = float(quota) if quota.isdigit() else None  # -1: none
    shares = files.get("cpu/cpu.shares", "").strip()
    usage.cpu_shares = float(shares) if shares.isdigit() else None
    _memory(usage, files.get("memory/memory.usage_in_bytes"), files.get("memory/memory.stat"), _V1_MEMORY_STAT)
    limit = files.get("memory/memory.limit_in_bytes", "").strip()
    if limit.isdigit():
        usage.memory_limit = float(limit) if int(limit) < _V1_UNLIMITED else 0.0
    failcnt = files.get("memory/memory.failcnt", "").strip()
    usage.memory_failcnt = float(failcnt) if failcnt.isdigit() else None
    if "memory/memory.oom_control" in files:
        usage.oom_events = _scaled(parse_flat_keyed(files["memory/memory.oom_control"]).get("oom_kill"), 1)
    if "blkio/blkio.throttle.io_service_bytes_recursive" in files:
        devices = parse_v1_io_service_bytes(files["blkio/blkio.throttle.io_service_bytes_recursive"])
        usage.io = [(number, float(read), float(written)) for number, (read, written) in sorted(devices.items())]
    return usage


# memory.stat keys of (rss, cache, mapped file, swap, inactive file); v2 has swap in a file of its own.
_V2_MEMORY_STAT = ("anon", "file", "file_mapped", "", "inactive_file")
_V1_MEMORY_STAT = ("total_rss", "total_cache", "total_mapped_file", "total_swap", "total_inactive_file")


def _memory(usage: Usage, current: str | None, stat: str | None, keys: tuple[str, ...]) -> None:
    """Usage, RSS, cache, mapped files, swap and the working set (usage less inactive file pages)."""
    if current is not None and current.strip().isdigit():
        usage.memory_usage = float(current)
    if stat is None:
        return
    memory = parse_flat_keyed(stat)
    rss, cache, mapped, swap, inactive = keys
    usage.memory_rss = _scaled(memory.get(rss), 1)
    usage.memory_cache = _scaled(memory.get(cache), 1)
    usage.memory_mapped_file = _scaled(memory.get(mapped), 1)
    if swap:
        usage.memory_swap = _scaled(memory.get(swap), 1)
    if usage.memory_usage is not None:
        usage.memory_working_set = max(usage.memory_usage - memory.get(inactive, 0), 0.0)


def _scaled(value: int | None, factor: float) -> float | None:
    return None if value is None else value * factor


V2_FILES = ("cpu.stat", "cpu.max", "cpu.weight", "memory.current", "memory.stat", "memory.max",
            "memory.swap.current", "memory.events", "io.stat")
V1_FILES = ("cpuacct/cpuacct.usage", "cpuacct/cpuacct.stat", "cpu/cpu.stat", "cpu/cpu.cfs_quota_us",
            "cpu/cpu.cfs_period_us", "cpu/cpu.shares", "memory/memory.usage_in_bytes", "memory/memory.stat",
            "memory/memory.limit_in_bytes", "memory/memory.failcnt", "memory/memory.oom_control",
            "blkio/blkio.throttle.io_service_bytes_recursive")


def container_id_of(component: str) -> str:
    """The container id a container cgroup's name holds: `<id>` (cgroupfs) or `cri-containerd-<id>.scope`
    (systemd)."""
    if component.endswith(".scope"):
        component = component[:-len(".scope")].rpartition("-")[2]
    return component


# -- I/O -----------------------------------------------------------------------------------------

class CgroupReader:
    """Reads the cgroups of the node's pods under `fs_root`, v1 or v2 as the host has them."""

    def __init__(self, fs_root: str = CGROUP_FS, cgroup_root: str = "/") -> None:
        self._fs = fs_root
        self.v2 = os.path.exists(os.path.join(fs_root, "cgroup.controllers"))
        # Where pod cgroups are listed: the whole tree on v2, the memory hierarchy on v1.
        self._list_root = fs_root if self.v2 else os.path.join(fs_root, "memory")
        self._qos_dirs = [
            cgroups.spell(name, driver) for driver in cgroups.DRIVERS
            for name in cgroups.qos_names(cgroup_root).values()]

    def pods(self) -> dict[str, tuple[str, list[str]]]:
        """pod uid -> (the pod cgroup's path, its children's names), for every pod cgroup of the QoS tree."""
        found: dict[str, tuple[str, list[str]]] = {}
        for qos_dir in self._qos_dirs:
            try:
                entries = list(os.scandir(self._list_root + qos_dir))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                uid = cgroups.pod_uid_of(entry.name)
                if uid is None or not entry.is_dir():
                    continue
                path = f"{qos_dir}/{entry.name}"
                try:
                    children = [child.name for child in os.scandir(entry.path) if child.is_dir()]
                except FileNotFoundError:
                    continue
                found[uid] = (path, children)
        return found

    def usage(self, path: str) -> Usage:
        """The usage of the cgroup at `path` (as /proc/<pid>/cgroup spells it); figures of files it lacks are None."""
        files = {}
        for name in (V2_FILES if self.v2 else V1_FILES):
            try:
                files[name] = _read_small(self._file(path, name))
            except OSError:
                continue
        return v2_usage(files) if self.v2 else v1_usage(files)

    def _file(self, path: str, name: str) -> str:
        if self.v2:
            return f"{self._fs}{path}/{name}"
        controller, _, file = name.partition("/")
        return f"{self._fs}/{controller}{path}/{file}"

    def first_pid(self, path: str) -> int | None:
        """A process of the cgroup (its network namespace is the pod's, for a sandbox)."""
        procs = self._file(path, "cgroup.procs") if self.v2 else f"{self._fs}/memory{path}/cgroup.procs"
        try:
            with open(procs) as handle:
                line = handle.readline()
        except OSError:
            return None
        return int(line) if line.strip().isdigit() else None


def _read_small(path: str) -> str:
    """A cgroup file's text (they are a few KiB at most), without the buffered file object's cost: a scrape at
    110 pods opens some 2,600 of them."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def device_names(numbers: list[str], read: Callable[[str], str]) -> dict[str, str]:
    """`<major>:<minor>` -> /dev/<name> from /sys/dev/block/<n>/uevent (`read` gives a file's text); a number
    without one keeps its number."""
    names = {}
    for number in numbers:
        try:
            fields = dict(line.partition("=")[::2] for line in read(f"/sys/dev/block/{number}/uevent").splitlines())
        except OSError:
            fields = {}
        names[number] = f"/dev/{fields['DEVNAME']}" if fields.get("DEVNAME") else number
    return names
