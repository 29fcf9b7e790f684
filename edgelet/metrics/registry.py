"""Every Prometheus metric the agent exports, named and bucketed as the kubelet does, and the small Counter,
Gauge and Histogram behind them, written out in the Prometheus text format 0.0.4 for /metrics.

A Counter's name ends in `_total` on the wire, added where missing (`kubelet_evictions` is scraped as
`kubelet_evictions_total`). There are no `_created` series: the kubelet does not expose them.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INF = float("inf")

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, float]


# --- the text format (pure) -----------------------------------------------------------------------


def format_value(value: float) -> str:
    """A number as Prometheus writes it: +Inf, -Inf, NaN, `1.0` for a whole number, and from a million on
    Go's exponent form (`1.5e+06`) where Python's repr would write `1500000.0`."""
    if value != value:
        return "NaN"
    if value in (_INF, -_INF):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    if not 1e6 <= abs(value) < 1e16:  # outside this range Python and Go write the same
        return text
    whole, _, fraction = text.lstrip("-").partition(".")
    digits = (whole + fraction).rstrip("0")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if value < 0 else ''}{mantissa}e+{len(whole) - 1:02d}"


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def escape_label_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def sample_line(name: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{name} {format_value(value)}\n"
    pairs = ",".join(f'{label}="{escape_label_value(text)}"' for label, text in labels)
    return f"{name}{{{pairs}}} {format_value(value)}\n"


# --- the registry ---------------------------------------------------------------------------------


class Registry:
    """The metric families one /metrics endpoint shows, in the order they were created."""

    __slots__ = ("_families",)

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def register(self, family: _Family) -> None:
        if family.name in self._families:
            raise ValueError(f"metric {family.name} is already registered")
        self._families[family.name] = family

    def exposition(self) -> bytes:
        """Every family in the text format: HELP, TYPE, then its samples (none for a family whose
        labels were never used)."""
        lines: list[str] = []
        for family in self._families.values():
            lines.append(f"# HELP {family.name} {escape_help(family.documentation)}\n")
            lines.append(f"# TYPE {family.name} {family.kind}\n")
            lines.extend(sample_line(*sample) for sample in family.samples())
        return "".join(lines).encode()


# --- metric families and their children -----------------------------------------------------------
#
# Writes happen on the event loop; a scrape or a test may read from another thread. One lock per family,
# taken by every write (about 0.1 µs uncontended) and once per scrape, keeps a histogram's buckets and sum
# in step and lets children be added while a scrape runs.


class _Family:
    """A named metric with its label names and one child per combination of label values."""

    __slots__ = ("name", "documentation", "labelnames", "_children", "_lock")
    kind = "untyped"

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] | list[str] = (), *,
                 registry: Registry) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"metric {name}: invalid label name {label!r}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}  # the kind's own child
        self._lock = threading.Lock()
        if not self.labelnames:
            self._children[()] = self._new_child()
        registry.register(self)

    def labels(self, *values: object, **by_name: object):
        """The child for these label values (positional in label order, or by name), created on first use."""
        if by_name and not values and set(by_name) == set(self.labelnames):
            values = tuple(by_name[label] for label in self.labelnames)
        elif by_name or not self.labelnames or len(values) != len(self.labelnames):
            raise ValueError(f"metric {self.name} takes the labels {list(self.labelnames)}")
        key = tuple(map(str, values))
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key, self._new_child())
        return child

    def remove(self, *values: object) -> None:
        """Drops one child's series; KeyError when there is none."""
        with self._lock:
            del self._children[tuple(map(str, values))]

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            snapshots = [(key, child._snapshot()) for key, child in self._children.items()]
        for key, snapshot in snapshots:
            yield from self._child_samples(tuple(zip(self.labelnames, key)), snapshot)

    def _unlabelled(self):
        if self.labelnames:
            raise ValueError(f"metric {self.name} has labels {list(self.labelnames)}: use labels() first")
        return self._children[()]

    def _new_child(self):
        raise NotImplementedError

    def _child_samples(self, labels: Labels, snapshot) -> Iterator[Sample]:
        yield self.name, labels, snapshot


class _Value:
    __slots__ = ("value", "_lock")

    def __init__(self, lock: threading.Lock) -> None:
        self.value = 0.0
        self._lock = lock

    def _snapshot(self) -> float:
        return self.value


class _CounterChild(_Value):
    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: cannot increment it by {amount}")
        with self._lock:
            self.value += amount


class _GaugeChild(_Value):
    __slots__ = ()

    def set(self, value: float) -> None:
        self.value = float(value)


class Counter(_Family):
    """A count that only goes up, named `<name>_total` (a given `_total` suffix is not doubled)."""

    __slots__ = ()
    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] | list[str] = (), *,
                 registry: Registry) -> None:
        super().__init__(name.removesuffix("_total") + "_total", documentation, labelnames, registry=registry)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)

    def _new_child(self) -> _CounterChild:
        return _CounterChild(self._lock)


class Gauge(_Family):
    """A value that is set."""

    __slots__ = ()
    kind = "gauge"

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def _new_child(self) -> _GaugeChild:
        return _GaugeChild(self._lock)


class _HistogramChild:
    __slots__ = ("_bounds", "_counts", "_sum", "_lock")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * len(bounds)  # per bucket, not cumulative: observing touches one
        self._sum = 0.0
        self._lock = lock

    def observe(self, value: float) -> None:
        # The first bucket whose bound is >= value; NaN, like Go's client, counts in +Inf.
        index = bisect_left(self._bounds, value) if value == value else len(self._bounds) - 1
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def _snapshot(self) -> tuple[list[int], float]:
        return list(self._counts), self._sum


class Histogram(_Family):
    """Observations counted into cumulative buckets (upper bounds given, +Inf added), with their sum."""

    __slots__ = ("_bounds",)
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] | list[str] = (), *,
                 buckets: tuple[float, ...], registry: Registry) -> None:
        bounds = tuple(float(bound) for bound in buckets)
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"metric {name}: buckets must be given in increasing order")
        if "le" in labelnames:
            raise ValueError(f"metric {name}: a histogram cannot have a label named le")
        self._bounds = bounds if bounds[-1] == _INF else (*bounds, _INF)
        super().__init__(name, documentation, labelnames, registry=registry)

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self._lock, self._bounds)

    def _child_samples(self, labels: Labels, snapshot: tuple[list[int], float]) -> Iterator[Sample]:
        counts, total = snapshot
        cumulative = 0
        for bound, count in zip(self._bounds, counts):
            cumulative += count
            yield self.name + "_bucket", (*labels, ("le", format_value(bound))), float(cumulative)
        yield self.name + "_sum", labels, total
        yield self.name + "_count", labels, float(cumulative)


# --- the agent's metrics --------------------------------------------------------------------------

REGISTRY = Registry()

# The kubelet's bucket layouts, so dashboards built for it read ours the same way.
_DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RUNTIME_OPERATION_BUCKETS = tuple(0.005 * 2.5**i for i in range(14))
_POD_START_SLI_BUCKETS = (
    0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)

runtime_operations_duration_seconds = Histogram(
    "kubelet_runtime_operations_duration_seconds",
    "Duration in seconds of CRI runtime operations, by operation type.",
    ["operation_type"],
    buckets=_RUNTIME_OPERATION_BUCKETS,
    registry=REGISTRY,
)
runtime_operations_errors = Counter(
    "kubelet_runtime_operations_errors_total",
    "Cumulative number of CRI runtime operation errors, by operation type.",
    ["operation_type"],
    registry=REGISTRY,
)

pleg_relist_duration_seconds = Histogram(
    "kubelet_pleg_relist_duration_seconds",
    "Duration in seconds for relisting pods in PLEG.",
    buckets=_DEFAULT_BUCKETS,
    registry=REGISTRY,
)
pleg_last_seen_seconds = Gauge(
    "kubelet_pleg_last_seen_seconds",
    "Timestamp in seconds when PLEG was last seen active.",
    registry=REGISTRY,
)
pleg_evented = Gauge(
    "edgelet_pleg_evented",
    "1 while the runtime's container events drive the PLEG's relists, 0 while it relists every relist_period.",
    registry=REGISTRY,
)

pod_worker_duration_seconds = Histogram(
    "kubelet_pod_worker_duration_seconds",
    "Duration in seconds of one step of a pod worker, by the pod's state: syncing, terminating or terminated "
    "(its clean-up).",
    ["operation_type"],
    buckets=_DEFAULT_BUCKETS,
    registry=REGISTRY,
)
pod_start_sli_duration_seconds = Histogram(
    "kubelet_pod_start_sli_duration_seconds",
    "Duration in seconds to start a pod, from first sight to all containers running, image pulls included.",
    buckets=_POD_START_SLI_BUCKETS,
    registry=REGISTRY,
)

running_pods = Gauge(
    "kubelet_running_pods",
    "Number of pods that have a running pod sandbox.",
    registry=REGISTRY,
)
running_containers = Gauge(
    "kubelet_running_containers",
    "Number of containers currently running, by container state.",
    ["container_state"],
    registry=REGISTRY,
)
started_containers = Counter(
    "kubelet_started_containers_total",
    "Cumulative number of containers started, by container type.",
    ["container_type"],
    registry=REGISTRY,
)
started_containers_errors = Counter(
    "kubelet_started_containers_errors_total",
    "Cumulative number of errors when starting containers, by container type and error code.",
    ["container_type", "code"],
    registry=REGISTRY,
)

# The kubelet's /metrics/probes: a registry of its own, served there and not on /metrics.
PROBES = Registry()

prober_probe = Counter(
    "prober_probe_total",
    "Cumulative number of a liveness, readiness or startup probe for a container by result.",
    ["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
    registry=PROBES,
)

evictions = Counter(
    "kubelet_evictions",
    "Cumulative number of pod evictions, by eviction signal.",
    ["eviction_signal"],
    registry=REGISTRY,
)

events_dropped = Counter(
    "edgelet_events_dropped",
    "Events not delivered, by why: queue_full, buffer_full (API unreachable), stale, rejected (by the API).",
    ["reason"],
    registry=REGISTRY,
)

tunnel_streams = Gauge(
    "edgelet_tunnel_streams",
    "konnectivity Connect streams open (one per konnectivity-server instance).",
    registry=REGISTRY,
)
tunnel_connections = Gauge(
    "edgelet_tunnel_connections",
    "Connections spliced through the konnectivity tunnel, open now.",
    registry=REGISTRY,
)
tunnel_dials = Counter(
    "edgelet_tunnel_dials",
    "Dials through the konnectivity tunnel that reached a permitted destination, by result: spliced, failed.",
    ["result"],
    registry=REGISTRY,
)
tunnel_dials_refused = Counter(
    "edgelet_tunnel_dials_refused",
    "Dials through the konnectivity tunnel refused, by reason: destination (not permitted), limit (max_connections).",
    ["reason"],
    registry=REGISTRY,
)
tunnel_bytes = Counter(
    "edgelet_tunnel_bytes",
    "Bytes spliced through the konnectivity tunnel, by direction: to_server, from_server.",
    ["direction"],
    registry=REGISTRY,
)


def exposition() -> bytes:
    """The current value of every metric of the agent in the Prometheus text format, for /metrics."""
    return REGISTRY.exposition()


def probes_exposition() -> bytes:
    """The probe results, for the kubelet API's /metrics/probes."""
    return PROBES.exposition()
