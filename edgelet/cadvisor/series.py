"""cAdvisor's Prometheus series from usage records (pure, table-tested): names, types, help and label names as
cAdvisor writes them behind the kubelet's /metrics/cadvisor, so the recording rules and dashboards of
kube-prometheus read an edgelet node as a kubelet node.

Every container series carries `container`, `id` (the cgroup path), `image`, `name` (the runtime's container id),
`namespace` and `pod`; a pod's own cgroup gives the same series with `container`, `image` and `name` empty. A value
the node cannot give (no cgroup file, no CRI figure) leaves its series out rather than writing a zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from edgelet.metrics.registry import escape_help, escape_label_value, format_value

Labels = tuple[tuple[str, str], ...]

COUNTER, GAUGE = "counter", "gauge"

# name -> (type, help, extra label names), in the order they are written.
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "container_cpu_usage_seconds_total": (COUNTER, "Cumulative cpu time consumed in seconds.", ("cpu",)),
    "container_cpu_user_seconds_total": (COUNTER, "Cumulative user cpu time consumed in seconds.", ()),
    "container_cpu_system_seconds_total": (COUNTER, "Cumulative system cpu time consumed in seconds.", ()),
    "container_cpu_cfs_periods_total": (COUNTER, "Number of elapsed enforcement period intervals.", ()),
    "container_cpu_cfs_throttled_periods_total": (COUNTER, "Number of throttled period intervals.", ()),
    "container_cpu_cfs_throttled_seconds_total": (COUNTER, "Total time duration the container has been throttled.",
                                                  ()),
    "container_memory_usage_bytes": (GAUGE, "Current memory usage in bytes, including all memory regardless of when "
                                            "it was accessed", ()),
    "container_memory_working_set_bytes": (GAUGE, "Current working set in bytes.", ()),
    "container_memory_rss": (GAUGE, "Size of RSS in bytes.", ()),
    "container_memory_cache": (GAUGE, "Number of bytes of page cache memory.", ()),
    "container_memory_mapped_file": (GAUGE, "Size of memory mapped files in bytes.", ()),
    "container_memory_swap": (GAUGE, "Container swap usage in bytes.", ()),
    "container_memory_failcnt": (COUNTER, "Number of memory usage hits limits", ()),
    "container_oom_events_total": (COUNTER, "Count of out of memory events observed for the container", ()),
    "container_fs_usage_bytes": (GAUGE, "Number of bytes that are consumed by the container on this filesystem.",
                                 ("device",)),
    "container_fs_reads_bytes_total": (COUNTER, "Cumulative count of bytes read", ("device",)),
    "container_fs_writes_bytes_total": (COUNTER, "Cumulative count of bytes written", ("device",)),
    "container_network_receive_bytes_total": (COUNTER, "Cumulative count of bytes received", ("interface",)),
    "container_network_receive_errors_total": (COUNTER, "Cumulative count of errors encountered while receiving",
                                               ("interface",)),
    "container_network_transmit_bytes_total": (COUNTER, "Cumulative count of bytes transmitted", ("interface",)),
    "container_network_transmit_errors_total": (COUNTER, "Cumulative count of errors encountered while "
                                                         "transmitting", ("interface",)),
    "container_spec_cpu_period": (GAUGE, "CPU period of the container.", ()),
    "container_spec_cpu_quota": (GAUGE, "CPU quota of the container.", ()),
    "container_spec_cpu_shares": (GAUGE, "CPU share of the container.", ()),
    "container_spec_memory_limit_bytes": (GAUGE, "Memory limit for the container.", ()),
    "container_start_time_seconds": (GAUGE, "Start time of the container since unix epoch in seconds.", ()),
    "container_last_seen": (GAUGE, "Last time a container was seen by the exporter", ()),
    "container_scrape_error": (GAUGE, "1 if there was an error while getting container metrics, 0 otherwise", ()),
    "machine_cpu_cores": (GAUGE, "Number of logical CPU cores.", ()),
    "machine_memory_bytes": (GAUGE, "Amount of memory installed on the machine.", ()),
}
IDENTITY = ("container", "id", "image", "name", "namespace", "pod")
MACHINE_LABELS = ("boot_id", "machine_id", "system_uuid")


@dataclass(frozen=True, slots=True)
class Identity:
    """The cAdvisor labels of one cgroup: a container's, or its pod's (container, image and name empty)."""

    pod: str
    namespace: str
    id: str = ""  # the cgroup path, e.g. /kubepods/besteffort/pod<uid>/<container id>
    container: str = ""
    image: str = ""
    name: str = ""  # the runtime's container id

    def labels(self) -> Labels:
        return (("container", self.container), ("id", self.id), ("image", self.image), ("name", self.name),
                ("namespace", self.namespace), ("pod", self.pod))


@dataclass(slots=True)
class Usage:
    """What is known of one cgroup; None where the node could not tell."""

    cpu_seconds: float | None = None
    cpu_user_seconds: float | None = None
    cpu_system_seconds: float | None = None
    cfs_periods: float | None = None
    cfs_throttled_periods: float | None = None
    cfs_throttled_seconds: float | None = None
    memory_usage: float | None = None
    memory_working_set: float | None = None
    memory_rss: float | None = None
    memory_cache: float | None = None
    memory_mapped_file: float | None = None
    memory_swap: float | None = None
    memory_failcnt: float | None = None
    oom_events: float | None = None
    cpu_period: float | None = None
    cpu_quota: float | None = None  # absent without a quota, as cAdvisor leaves it out
    cpu_shares: float | None = None
    memory_limit: float | None = None  # 0: no limit
    start_time: float | None = None
    fs_usage: list[tuple[str, float]] = field(default_factory=list)  # (device, bytes)
    io: list[tuple[str, float, float]] = field(default_factory=list)  # (device, read bytes, written bytes)
    network: list[tuple[str, float, float, float, float]] = field(default_factory=list)
    # (interface, rx bytes, rx errors, tx bytes, tx errors)

    def merge(self, other: Usage) -> Usage:
        """This record with the gaps filled from `other` (lists taken from `other` where this has none)."""
        for name in self.__slots__:
            if getattr(self, name) in (None, []):
                setattr(self, name, getattr(other, name))
        return self


@dataclass(frozen=True, slots=True)
class Machine:
    cpu_cores: int
    memory_bytes: int
    boot_id: str = ""
    machine_id: str = ""
    system_uuid: str = ""


_SCALARS = (
    ("container_cpu_user_seconds_total", "cpu_user_seconds"),
    ("container_cpu_system_seconds_total", "cpu_system_seconds"),
    ("container_cpu_cfs_periods_total", "cfs_periods"),
    ("container_cpu_cfs_throttled_periods_total", "cfs_throttled_periods"),
    ("container_cpu_cfs_throttled_seconds_total", "cfs_throttled_seconds"),
    ("container_memory_usage_bytes", "memory_usage"),
    ("container_memory_working_set_bytes", "memory_working_set"),
    ("container_memory_rss", "memory_rss"),
    ("container_memory_cache", "memory_cache"),
    ("container_memory_mapped_file", "memory_mapped_file"),
    ("container_memory_swap", "memory_swap"),
    ("container_memory_failcnt", "memory_failcnt"),
    ("container_oom_events_total", "oom_events"),
    ("container_spec_cpu_period", "cpu_period"),
    ("container_spec_cpu_quota", "cpu_quota"),
    ("container_spec_cpu_shares", "cpu_shares"),
    ("container_spec_memory_limit_bytes", "memory_limit"),
    ("container_start_time_seconds", "start_time"),
)

Sample = tuple[str, Labels, float]


def cgroup_samples(identity: Identity, usage: Usage, now: float) -> Iterator[Sample]:
    """The series of one cgroup."""
    labels = identity.labels()
    if usage.cpu_seconds is not None:
        yield "container_cpu_usage_seconds_total", (*labels, ("cpu", "total")), usage.cpu_seconds
    for family, attribute in _SCALARS:
        value = getattr(usage, attribute)
        if value is not None:
            yield family, labels, value
    for device, used in usage.fs_usage:
        yield "container_fs_usage_bytes", (*labels, ("device", device)), used
    for device, read, written in usage.io:
        yield "container_fs_reads_bytes_total", (*labels, ("device", device)), read
        yield "container_fs_writes_bytes_total", (*labels, ("device", device)), written
    for interface, rx_bytes, rx_errors, tx_bytes, tx_errors in usage.network:
        interface_labels = (*labels, ("interface", interface))
        yield "container_network_receive_bytes_total", interface_labels, rx_bytes
        yield "container_network_receive_errors_total", interface_labels, rx_errors
        yield "container_network_transmit_bytes_total", interface_labels, tx_bytes
        yield "container_network_transmit_errors_total", interface_labels, tx_errors
    yield "container_last_seen", labels, now


def machine_samples(machine: Machine) -> Iterator[Sample]:
    labels = (("boot_id", machine.boot_id), ("machine_id", machine.machine_id), ("system_uuid", machine.system_uuid))
    yield "machine_cpu_cores", labels, float(machine.cpu_cores)
    yield "machine_memory_bytes", labels, float(machine.memory_bytes)


def render(samples: Iterable[Sample]) -> bytes:
    """The text format, families in FAMILIES order, each with HELP and TYPE once (and only when it has samples).
    A cgroup's labels are escaped once for all its series (at 110 pods that is 4,000 lines of 7 labels)."""
    by_family: dict[str, list[str]] = {}
    label_texts: dict[Labels, str] = {}
    for family, labels, value in samples:
        text = label_texts.get(labels)
        if text is None:
            text = label_texts[labels] = ",".join(f'{name}="{escape_label_value(v)}"' for name, v in labels)
        line = f"{family}{{{text}}} {format_value(value)}\n" if labels else f"{family} {format_value(value)}\n"
        by_family.setdefault(family, []).append(line)
    out: list[str] = []
    for family, (kind, help_text, _extra) in FAMILIES.items():
        lines = by_family.get(family)
        if lines:
            out.append(f"# HELP {family} {escape_help(help_text)}\n# TYPE {family} {kind}\n")
            out.extend(lines)
    return "".join(out).encode()
