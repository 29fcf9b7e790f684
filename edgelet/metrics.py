"""Every Prometheus metric the agent exports, on one private registry, named as the kubelet names them.

Counters appear with the `_total` suffix on the wire (prometheus_client adds it), so `kubelet_evictions`
is scraped as `kubelet_evictions_total`.
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

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
pleg_relist_interval_seconds = Histogram(
    "kubelet_pleg_relist_interval_seconds",
    "Interval in seconds between relisting in PLEG.",
    buckets=_DEFAULT_BUCKETS,
    registry=REGISTRY,
)
pleg_last_seen_seconds = Gauge(
    "kubelet_pleg_last_seen_seconds",
    "Timestamp in seconds when PLEG was last seen active.",
    registry=REGISTRY,
)

pod_worker_duration_seconds = Histogram(
    "kubelet_pod_worker_duration_seconds",
    "Duration in seconds to sync a single pod, by operation type: create, update or sync.",
    ["operation_type"],
    buckets=_DEFAULT_BUCKETS,
    registry=REGISTRY,
)
pod_start_sli_duration_seconds = Histogram(
    "kubelet_pod_start_sli_duration_seconds",
    "Duration in seconds to start a pod, excluding image pulls, from first sight to all containers running.",
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

prober_probe = Counter(
    "prober_probe_total",
    "Cumulative number of liveness, readiness or startup probe results for a container.",
    ["probe_type", "container", "pod", "namespace", "result"],
    registry=REGISTRY,
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

CONTENT_TYPE = CONTENT_TYPE_LATEST


def exposition() -> bytes:
    """The current value of every metric in the Prometheus text format, for a /metrics handler."""
    return generate_latest(REGISTRY)
