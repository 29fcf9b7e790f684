"""/stats/summary and /metrics/resource: the node from /proc and statvfs, pods and containers from CRI
ListPodSandboxStats / ListContainerStats; the kubelet's Summary shape (stats/v1alpha1), built by pure functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from edgelet.cadvisor.procfs import parse_net_dev
from edgelet.container import labels
from edgelet.cri import RuntimeCallError
from edgelet.eviction.signals import existing_parent, memory_observation, parse_meminfo
from edgelet.eviction.usage import directory_usage
from edgelet.metrics.registry import escape_label_value

log = logging.getLogger(__name__)


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- CPU rate ------------------------------------------------------------------------------------

class CpuRates:
    """usageNanoCores from two cumulative samples per key, as the kubelet's CRI stats provider does
    when the runtime leaves the rate out."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}

    def rate(self, key: str, timestamp_ns: int, usage_core_ns: int) -> int | None:
        previous = self._last.get(key)
        self._last[key] = (timestamp_ns, usage_core_ns)
        if previous is None or timestamp_ns <= previous[0] or usage_core_ns < previous[1]:
            return None
        return (usage_core_ns - previous[1]) * 1_000_000_000 // (timestamp_ns - previous[0])

    def forget_except(self, keys: Iterable[str]) -> None:
        keep = set(keys)
        for key in list(self._last):
            if key not in keep:
                del self._last[key]


def cpu_stats(timestamp_ns: int, usage_core_ns: int | None, nano_cores: int | None) -> dict[str, Any]:
    stats: dict[str, Any] = {"time": rfc3339(timestamp_ns)}
    if nano_cores is not None:
        stats["usageNanoCores"] = nano_cores
    if usage_core_ns is not None:
        stats["usageCoreNanoSeconds"] = usage_core_ns
    return stats


# -- node (pure parts) ---------------------------------------------------------------------------

def parse_proc_stat(text: str, clock_ticks: int) -> tuple[int, int]:
    """(busy CPU nanoseconds of all cores, boot time in seconds) from /proc/stat."""
    busy = boot = 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            busy = (user + nice + system + irq + softirq + steal) * 1_000_000_000 // clock_ticks
        elif fields and fields[0] == "btime":
            boot = int(fields[1])
    return busy, boot


def default_route_interface(route_text: str) -> str:
    """The interface of the IPv4 default route in /proc/net/route ("" when there is none)."""
    for line in route_text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[1] == "00000000" and int(fields[3], 16) & 1:
            return fields[0]
    return ""


def network_stats(timestamp_ns: int, interfaces: Mapping[str, tuple[int, int, int, int]],
                  default: str) -> dict[str, Any]:
    items = [{"name": name, "rxBytes": rx, "rxErrors": rxe, "txBytes": tx, "txErrors": txe}
             for name, (rx, rxe, tx, txe) in sorted(interfaces.items())]
    stats: dict[str, Any] = {"time": rfc3339(timestamp_ns), "interfaces": items}
    chosen = next((item for item in items if item["name"] == default), items[0] if items else None)
    if chosen is not None:
        stats.update(chosen)
    return stats


def fs_stats(timestamp_ns: int, vfs: os.statvfs_result, used_bytes: int | None = None) -> dict[str, Any]:
    capacity = vfs.f_blocks * vfs.f_frsize
    available = vfs.f_bavail * vfs.f_frsize
    stats = {"time": rfc3339(timestamp_ns), "availableBytes": available, "capacityBytes": capacity,
             "usedBytes": used_bytes if used_bytes is not None else (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize}
    if vfs.f_files:
        stats.update(inodesFree=vfs.f_ffree, inodes=vfs.f_files, inodesUsed=vfs.f_files - vfs.f_ffree)
    return stats


def volume_stats(timestamp_ns: int, name: str, vfs: os.statvfs_result, used: tuple[int, int],
                 claim: tuple[str, str] | None = None) -> dict[str, Any]:
    """A pod volume's VolumeStats: its filesystem's capacity and what is free, the bytes and inodes below it."""
    stats = {**fs_stats(timestamp_ns, vfs, used[0]), "name": name}
    if "inodes" in stats:
        stats["inodesUsed"] = used[1]
    if claim is not None:
        stats["pvcRef"] = {"name": claim[1], "namespace": claim[0]}
    return stats


def node_memory_stats(timestamp_ns: int, meminfo: Mapping[str, int]) -> dict[str, Any]:
    observation = memory_observation(meminfo)
    total = meminfo.get("MemTotal", 0)
    return {"time": rfc3339(timestamp_ns), "availableBytes": observation.available,
            "usageBytes": total - meminfo.get("MemFree", 0), "workingSetBytes": total - observation.available}


# -- pods and containers (pure) ------------------------------------------------------------------

def cri_cpu(usage: Any, key: str, rates: CpuRates) -> dict[str, Any]:
    total = usage.usage_core_nano_seconds.value if usage.HasField("usage_core_nano_seconds") else None
    nano = usage.usage_nano_cores.value if usage.HasField("usage_nano_cores") else None
    timestamp = usage.timestamp or time.time_ns()
    if total is not None:
        computed = rates.rate(key, timestamp, total)
        nano = nano if nano else computed
    return cpu_stats(timestamp, total, nano)


def cri_memory(usage: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {"time": rfc3339(usage.timestamp or time.time_ns())}
    for name, key in (("working_set_bytes", "workingSetBytes"), ("available_bytes", "availableBytes"),
                      ("usage_bytes", "usageBytes"), ("rss_bytes", "rssBytes"), ("page_faults", "pageFaults"),
                      ("major_page_faults", "majorPageFaults")):
        if usage.HasField(name):
            stats[key] = getattr(usage, name).value
    return stats


@dataclass(slots=True)
class PodStats:
    ref: dict[str, str]
    start_ns: int = 0
    containers: list[dict[str, Any]] = field(default_factory=list)
    cpu: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    network: dict[str, Any] | None = None
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"podRef": self.ref, "startTime": rfc3339(self.start_ns or time.time_ns()),
                               "containers": self.containers}
        if self.volumes:
            out["volume"] = self.volumes
        for key, value in (("cpu", self.cpu), ("memory", self.memory), ("network", self.network)):
            if value is not None:
                out[key] = value
        return out


def container_json(stats: Any, rates: CpuRates, start_ns: int, logs_fs: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": stats.attributes.metadata.name, "startTime": rfc3339(start_ns or time.time_ns())}
    if stats.HasField("cpu"):
        out["cpu"] = cri_cpu(stats.cpu, stats.attributes.id, rates)
    if stats.HasField("memory"):
        out["memory"] = cri_memory(stats.memory)
    if stats.HasField("writable_layer") and logs_fs is not None:
        used = stats.writable_layer.used_bytes.value
        out["rootfs"] = {**logs_fs, "usedBytes": used}
    if logs_fs is not None:
        out["logs"] = logs_fs
    return out


def sum_pod_usage(containers: list[dict[str, Any]], timestamp_ns: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod's CPU and memory as the sum of its containers' (when the runtime has no sandbox stats)."""
    def total(section: str, key: str) -> int | None:
        values = [c[section][key] for c in containers if key in c.get(section, {})]
        return sum(values) if values else None

    cpu = cpu_stats(timestamp_ns, total("cpu", "usageCoreNanoSeconds"), total("cpu", "usageNanoCores"))
    memory: dict[str, Any] = {"time": rfc3339(timestamp_ns)}
    for key in ("workingSetBytes", "usageBytes", "rssBytes"):
        value = total("memory", key)
        if value is not None:
            memory[key] = value
    return cpu, memory


def cri_network(usage: Any) -> dict[str, Any]:
    interfaces = {item.name: (item.rx_bytes.value, item.rx_errors.value, item.tx_bytes.value, item.tx_errors.value)
                  for item in [usage.default_interface, *usage.interfaces] if item.name}
    return network_stats(usage.timestamp or time.time_ns(), interfaces, usage.default_interface.name)


# -- /metrics/resource ---------------------------------------------------------------------------

def resource_metrics(summary: Mapping[str, Any]) -> str:
    """The Prometheus text metrics-server reads from /metrics/resource."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels_text} {value!r}" for labels_text, value in samples)

    node = summary.get("node", {})
    family("node_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the node in core-seconds",
           [("", node["cpu"]["usageCoreNanoSeconds"] / 1e9)] if "usageCoreNanoSeconds" in node.get("cpu", {}) else [])
    family("node_memory_working_set_bytes", "gauge", "Current working set of the node in bytes",
           [("", node["memory"]["workingSetBytes"])] if "workingSetBytes" in node.get("memory", {}) else [])
    pods_cpu, pods_mem, containers_cpu, containers_mem, starts = [], [], [], [], []
    for pod in summary.get("pods", []):
        ref = pod["podRef"]
        pod_labels = f'namespace="{escape_label_value(ref["namespace"])}",pod="{escape_label_value(ref["name"])}"'
        if "usageCoreNanoSeconds" in pod.get("cpu", {}):
            pods_cpu.append((f"{{{pod_labels}}}", pod["cpu"]["usageCoreNanoSeconds"] / 1e9))
        if "workingSetBytes" in pod.get("memory", {}):
            pods_mem.append((f"{{{pod_labels}}}", pod["memory"]["workingSetBytes"]))
        for container in pod.get("containers", []):
            container_labels = f'{{container="{escape_label_value(container["name"])}",{pod_labels}}}'
            if "usageCoreNanoSeconds" in container.get("cpu", {}):
                containers_cpu.append((container_labels, container["cpu"]["usageCoreNanoSeconds"] / 1e9))
            if "workingSetBytes" in container.get("memory", {}):
                containers_mem.append((container_labels, container["memory"]["workingSetBytes"]))
            started = datetime.strptime(container["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            starts.append((container_labels, float(started.timestamp())))
    family("container_cpu_usage_seconds_total", "counter",
           "Cumulative cpu time consumed by the container in core-seconds", containers_cpu)
    family("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes",
           containers_mem)
    family("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds",
           starts)
    family("pod_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the pod in core-seconds",
           pods_cpu)
    family("pod_memory_working_set_bytes", "gauge", "Current working set of the pod in bytes", pods_mem)
    family("scrape_error", "gauge", "1 if there was an error while getting container metrics, 0 otherwise",
           [("", summary.get("scrapeError", 0))])
    return "\n".join(out) + "\n"


# -- gathering (I/O) -----------------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


# -- volumes -------------------------------------------------------------------------------------

VOLUME_STATS_PERIOD = 60.0  # the kubelet's volumeStatsAggPeriod


class UsageCache:
    """What each volume directory uses on disk (du-like bytes and inodes on one filesystem, as the eviction manager
    measures emptyDirs), measured again once older than `period` seconds: a walk of a large volume costs I/O, and
    /stats/summary is scraped often."""

    def __init__(self, period: float = VOLUME_STATS_PERIOD, clock: Callable[[], float] = time.monotonic,
                 measure: Callable[[str], tuple[int, int]] = directory_usage):
        self.period = period
        self._clock = clock
        self._measure = measure
        self._taken: dict[str, tuple[float, tuple[int, int]]] = {}

    def usage(self, path: str) -> tuple[int, int]:
        """Blocking (a walk when stale): call from a thread."""
        now = self._clock()
        taken = self._taken.get(path)
        if taken is None or now - taken[0] >= self.period:
            taken = self._taken[path] = (now, self._measure(path))
        return taken[1]

    def forget_except(self, paths: set[str]) -> None:
        for path in [p for p in self._taken if p not in paths]:
            del self._taken[path]


class SummaryProvider:
    """Gathers one Summary per call; keeps the previous CPU samples to derive usageNanoCores."""

    def __init__(self, runtime: Any, *, node_name: str, root_dir: str, logs_dir: str,
                 container_start: Callable[[str], int] = lambda container_id: 0,
                 pod_sandbox: Callable[[str], Any] = lambda pod_uid: None,
                 claimed_volumes: Callable[[str], list[Any]] = lambda pod_uid: [],
                 csi_volume_stats: Callable[[str], Awaitable[dict[str, int] | None]] | None = None) -> None:
        self._runtime = runtime
        self._node_name = node_name
        self._root_dir = root_dir
        self._logs_dir = logs_dir
        self._container_start = container_start
        self._pod_sandbox = pod_sandbox
        self._claimed_volumes = claimed_volumes  # a pod's claims (volumes.manager.ClaimedPath)
        self._csi_volume_stats = csi_volume_stats
        self._usage = UsageCache()
        self._sandbox_pids: dict[str, int] = {}  # sandbox id -> its first process, whose netns is the pod's
        self._rates = CpuRates()
        self._sandbox_stats_supported = True
        self._sandbox_stats_failed = False  # logged once

    async def summary(self) -> dict[str, Any]:
        now = time.time_ns()
        node, scrape_error = self._node(now), 0
        try:
            pods = await self._pods(now)
            node["runtime"] = await self._image_fs(now)
        except RuntimeCallError as err:
            log.warning("kubelet API: runtime stats unavailable: %s", err)
            pods, scrape_error = [], 1
        return {"node": node, "pods": [pod.as_json() for pod in pods], "scrapeError": scrape_error}

    def _node(self, now: int) -> dict[str, Any]:
        busy, boot = parse_proc_stat(_read("/proc/stat"), os.sysconf("SC_CLK_TCK"))
        node = {"nodeName": self._node_name, "startTime": rfc3339(boot * 1_000_000_000),
                "cpu": cpu_stats(now, busy, self._rates.rate("/", now, busy)),
                "memory": node_memory_stats(now, parse_meminfo(_read("/proc/meminfo"))),
                "network": network_stats(now, parse_net_dev(_read("/proc/net/dev")),
                                         default_route_interface(_read("/proc/net/route"))),
                "fs": fs_stats(now, os.statvfs(existing_parent(self._root_dir)))}
        return node

    async def _image_fs(self, now: int) -> dict[str, Any]:
        info = await self._runtime.image_fs_info()
        for usage in info.image_filesystems:
            path = existing_parent(usage.fs_id.mountpoint or self._root_dir)
            return {"imageFs": fs_stats(now, os.statvfs(path), usage.used_bytes.value)}
        return {}

    async def _pods(self, now: int) -> list[PodStats]:
        containers = await self._runtime.list_container_stats()
        sandboxes = await self._sandbox_stats()
        logs_fs = fs_stats(now, os.statvfs(existing_parent(self._logs_dir)))
        pods: dict[str, PodStats] = {}
        for sandbox in sandboxes:
            meta = sandbox.attributes.metadata
            pod = pods.setdefault(meta.uid, PodStats({"name": meta.name, "namespace": meta.namespace, "uid": meta.uid}))
            linux = sandbox.linux
            if linux.HasField("cpu"):
                pod.cpu = cri_cpu(linux.cpu, "pod:" + meta.uid, self._rates)
            if linux.HasField("memory"):
                pod.memory = cri_memory(linux.memory)
            if linux.HasField("network"):
                pod.network = cri_network(linux.network)
        for stats in containers:
            attrs = stats.attributes.labels
            uid = attrs.get(labels.POD_UID, "")
            if not uid:
                continue
            pod = pods.setdefault(uid, PodStats({"name": attrs.get(labels.POD_NAME, ""),
                                                 "namespace": attrs.get(labels.POD_NAMESPACE, ""), "uid": uid}))
            start = self._container_start(stats.attributes.id)
            pod.containers.append(container_json(stats, self._rates, start, logs_fs))
            pod.start_ns = min(filter(None, (pod.start_ns, start)), default=0)
        sandboxes_seen: set[str] = set()
        volume_paths: set[str] = set()
        for uid, pod in pods.items():
            if pod.cpu is None or pod.memory is None:
                cpu, memory = sum_pod_usage(pod.containers, now)
                pod.cpu, pod.memory = pod.cpu or cpu, pod.memory or memory
            if pod.network is None:
                pod.network = await self._pod_network(uid, now, sandboxes_seen)
            if claimed := self._claimed_volumes(uid):
                pod.volumes = await self._pod_volume_stats(claimed, now)
                volume_paths.update(volume.path for volume in claimed)
        self._sandbox_pids = {sid: pid for sid, pid in self._sandbox_pids.items() if sid in sandboxes_seen}
        self._usage.forget_except(volume_paths)
        self._rates.forget_except(["/", *(s.attributes.id for s in containers), *("pod:" + u for u in pods)])
        return sorted(pods.values(), key=lambda p: (p.ref["namespace"], p.ref["name"]))

    async def _pod_volume_stats(self, claimed: list[Any], now: int) -> list[dict[str, Any]]:
        """A CSI volume's from its driver (NodeGetVolumeStats) where it reports them, else statvfs and a walk of the
        directory (once a period, see UsageCache)."""
        found = []
        for volume in claimed:
            reported = await self._csi_volume_stats(volume.path) if volume.csi and self._csi_volume_stats else None
            if reported:
                found.append({"time": rfc3339(now), **reported, "name": volume.volume,
                              "pvcRef": {"name": volume.claim, "namespace": volume.namespace}})
                continue
            try:
                vfs, used = await asyncio.to_thread(_statvfs_and_usage, volume.path, self._usage)
            except OSError as err:
                log.debug("volume %s: no stats: %s", volume.volume, err)
                continue
            found.append(volume_stats(now, volume.volume, vfs, used, (volume.namespace, volume.claim)))
        return found

    async def _pod_network(self, pod_uid: str, now: int, seen: set[str]) -> dict[str, Any] | None:
        """A pod network's counters from /proc/<sandbox pid>/net/dev; None for host-network pods (whose
        traffic is the node's) and when the sandbox is gone."""
        sandbox = self._pod_sandbox(pod_uid)
        if sandbox is None or sandbox.host_network:
            return None
        seen.add(sandbox.id)
        pid = self._sandbox_pids.get(sandbox.id)
        if pid is None:
            reply = await self._runtime.pod_sandbox_status(sandbox.id, verbose=True)
            try:
                pid = int(json.loads(reply.info.get("info", "{}")).get("pid", 0))
            except (ValueError, TypeError, AttributeError):
                pid = 0
            if not pid:
                return None
            self._sandbox_pids[sandbox.id] = pid
        try:
            interfaces = parse_net_dev(_read(f"/proc/{pid}/net/dev"))
        except OSError:
            self._sandbox_pids.pop(sandbox.id, None)
            return None
        return network_stats(now, interfaces, "eth0")

    async def _sandbox_stats(self) -> list[Any]:
        if not self._sandbox_stats_supported:
            return []
        try:
            return await self._runtime.list_pod_sandbox_stats()
        except RuntimeCallError as err:
            # containerd 1.6 fails the whole list when one sandbox has no cgroup of its own.
            if err.code == "UNIMPLEMENTED":
                self._sandbox_stats_supported = False
            if not self._sandbox_stats_failed:
                log.info("pod usage is summed from its containers: ListPodSandboxStats failed: %s", err)
                self._sandbox_stats_failed = True
            return []


def _statvfs_and_usage(path: str, usage: Any) -> tuple[os.statvfs_result, Any]:
    """A volume's file system figures and what its directory uses (blocking: in a thread)."""
    return os.statvfs(path), usage.usage(path)
