"""The node's side of the API server, wired once: Node registration and status, the Lease (whose lapse ending
heals the node status), the API pod source, pod statuses with mirror pods, and events.

The agent's cluster connection (edgelet/cluster/connection.py) and the simulator's hollow nodes (edgelet/simulate/) both
build a `ClusterApi`, so a hollow node runs exactly the agent's control-plane wiring; what differs between them
(credentials, what the node reports of itself, where API pods go) comes in as arguments.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Protocol

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.config import ClusterConfig
from edgelet.events import NO_EVENTS, EventRecorder
from edgelet.events.apisink import ApiEventSink
from edgelet.kubeapi.client import ApiClient
from edgelet.nodestatus.lease import LeaseController
from edgelet.nodestatus.manager import NodeReport, NodeStatusManager
from edgelet.nodestatus.taints import parse_taint
from edgelet.pod.manager import PodManager
from edgelet.podconfig.apiserver import ApiServerSource
from edgelet.status.apisync import StatusSyncer
from edgelet.status.manager import StatusManager
from edgelet.status.mirror import NO_STATIC_PODS, MirrorPods, StaticPods, split_mirror_pods
from edgelet.util.tasks import TaskGroup

# After a Lease renewal that ends an outage the pod watch reconnects at a random point within RELIST_SPREAD_ALONE
# seconds, or within RELIST_SPREAD_CROWD renew intervals when that renewal took CROWDED_RENEWAL seconds or more: an API
# server that slow is answering a fleet that came back with it (an idle one answers a Lease PUT in milliseconds).
RELIST_SPREAD_ALONE = 2.0
RELIST_SPREAD_CROWD = 3.0
CROWDED_RENEWAL = 1.0


class PodHandle(Protocol):
    """Where the API pod source's regular pods go (a pod config source, possibly behind the offline cache)."""

    def set(self, pods: Iterable[Pod]) -> None: ...

    def mark_ready(self) -> None: ...

    @property
    def ready(self) -> bool: ...


class MirrorSplitter:
    """The API pod source's handle: mirror pods go to the mirror manager, every other pod downstream.

    It also keeps each API pod exactly as the watch last delivered it: the pod config keeps a pod's old
    metadata when only its status changed, and the status syncer needs the current resourceVersion."""

    def __init__(self, downstream: PodHandle, on_mirrors: Callable[[list[Pod]], None]):
        self._downstream = downstream
        self._on_mirrors = on_mirrors
        self._latest: dict[str, Pod] = {}

    def set(self, pods: Iterable[Pod]) -> None:
        regular, mirrors = split_mirror_pods(pods)
        self._latest = {podutil.uid(pod): pod for pod in regular}
        self._on_mirrors(mirrors)
        self._downstream.set(regular)

    def latest(self, uid: str) -> Pod | None:
        return self._latest.get(uid)

    def mark_ready(self) -> None:
        self._downstream.mark_ready()

    @property
    def ready(self) -> bool:
        return self._downstream.ready


class ClusterApi:
    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        cluster: ClusterConfig,
        *,
        report: NodeReport,
        api_pods: PodHandle,
        pod_manager: PodManager,
        status_manager: StatusManager,
        static: StaticPods = NO_STATIC_PODS,
        recorder: EventRecorder | None = None,
        rng: random.Random | None = None,
        could_have_running_containers: Callable[[str], bool] = lambda uid: False,
    ):
        """`cluster` gives the timings and node labels; `api_pods` receives the API's pods bound to this node
        (mirror pods excepted); `static` the static pods that need mirrors (the pod config's). Events the
        recorder takes are posted to the API server."""
        self.client = client
        self.events = ApiEventSink(client)
        if recorder is not None:
            recorder.add_sink(self.events)
        self.node_status = NodeStatusManager(
            client, node_name, report,
            node_labels=cluster.node_labels,
            register_taints=tuple(parse_taint(taint) for taint in cluster.register_with_taints),
            on_pod_cidr=report.pod_cidr_handler,
            update_frequency=cluster.node_status_update_frequency,
            report_frequency=cluster.node_status_report_frequency,
            rng=rng,
            recorder=recorder or NO_EVENTS,
        )
        self.lease = LeaseController(client, node_name, duration=cluster.lease_duration,
                                     renew_interval=cluster.lease_renew_interval, rng=rng,
                                     node_uid=lambda: self.node_status.node_uid,
                                     on_lapse_ended=self._link_back)
        self.mirrors = MirrorPods(client, node_name, pod_manager, static=static,
                                  node_uid=lambda: self.node_status.node_uid)
        self.splitter = MirrorSplitter(api_pods, self.mirrors.set_mirror_pods)
        self.status = StatusSyncer(
            client, node_name, status_manager, pod_manager, self.mirrors,
            resync=cluster.status_resync,
            # Like the kubelet, retry no later than the next resync; reconnect bursts are jittered all the same.
            backoff_max=max(cluster.status_resync, 0.5),
            api_pod=self.splitter.latest,
            rng=rng,
            could_have_running_containers=could_have_running_containers,
        )
        self.source = ApiServerSource(client, node_name, self.splitter, rng=rng)
        self._renew_interval = cluster.lease_renew_interval
        self._link_back_callbacks: list[Callable[[], None]] = []

    def when_link_back(self, callback: Callable[[], None]) -> None:
        """Calls `callback` each time the Lease is renewed after failures or a lapse: the API server (and what
        sits beside it, like konnectivity-server) is reachable again."""
        self._link_back_callbacks.append(callback)

    def _link_back(self) -> None:
        # A lapse may have let the node lifecycle controller mark the Node.
        self.node_status.reconcile_with_server()
        # The pod watch need not wait out the reflector's backoff (up to a minute). A fleet's Leases come back
        # together (the apiserver answers the renewals queued during its start-up at once, slowly), so a slow
        # renewal spreads this node's re-list over 3 renew intervals: about N/30 per second at the default 10 s,
        # well under the N/10 budget. A node alone with its API server re-lists within 2 s.
        crowded = self.lease.last_renew_took >= CROWDED_RENEWAL
        self.source.reconnect_soon(RELIST_SPREAD_CROWD * self._renew_interval if crowded else RELIST_SPREAD_ALONE)
        for callback in self._link_back_callbacks:
            callback()

    def start(self, tasks: TaskGroup, prefix: str) -> None:
        """Starts the API work as tasks named `<prefix>:<part>`."""
        tasks.start(f"{prefix}:pod-source", self.source.run())
        tasks.start(f"{prefix}:node-status", self.node_status.run())
        tasks.start(f"{prefix}:lease", self.lease.run())
        tasks.start(f"{prefix}:pod-status", self.status.run())
        tasks.start(f"{prefix}:events", self.events.run())
