"""Cluster mode in one place: the API client (from the kubeconfig, or TLS bootstrap with a token), the cached
API pod source, the ConfigMaps and Secrets pods reference, the Services for their variables, node registration
with its status and Lease, and pod statuses with mirror pods.

The Agent builds one `ClusterConnection` when the config has a `[cluster]` section and starts it; nothing in
here can stop the agent: an unreachable API server only delays what is sent to it. The API work itself is wired
by `edgelet.cluster.clusterapi.ClusterApi`, which the simulator's hollow nodes share; this module adds the agent's side:
credentials, the offline pod cache, the ConfigMaps and Secrets, and what the node reports from its runtime.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgelet.api import podutil
from edgelet.api.env import api_server_address, kubernetes_service
from edgelet.api.objectstore import ObjectStore
from edgelet.api.podutil import Pod
from edgelet.cluster.clusterapi import ClusterApi
from edgelet.cluster.services import ServiceInformer
from edgelet.cm.cgroups import reserved_total
from edgelet.config import Config, EvictionConfig
from edgelet.container.runtime import RuntimeFeatures
from edgelet.events import EventRecorder
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import Unauthorized
from edgelet.kubeapi.objects import ObjectSyncer
from edgelet.nodestatus.facts import gather_node_info
from edgelet.nodestatus.health import NodeHealth
from edgelet.nodestatus.manager import NodeReport
from edgelet.nodestatus.setters import PressureThresholds, Reserved
from edgelet.pod.manager import PodManager
from edgelet.podconfig.cache import CachingHandle, PodCheckpoints
from edgelet.podconfig.config import PodConfig
from edgelet.status.manager import StatusManager
from edgelet.util.tasks import TaskGroup

API_SOURCE = podutil.SOURCE_API
# How long new API pods wait for the ConfigMaps and Secrets they reference, and for the first list of Services,
# before they are started anyway.
OBJECTS_WAIT = 5.0
# Refresh period of referenced ConfigMaps and Secrets (see edgelet/kubeapi/objects.py for why GETs).
OBJECTS_REFRESH = 60.0


def pressure_thresholds(eviction: EvictionConfig) -> PressureThresholds:
    """The node conditions' pressure limits from the eviction thresholds the config sets."""
    thresholds = eviction.thresholds()
    limits: dict[str, Any] = {}
    memory = thresholds.get("memory.available")
    if memory is not None and memory.quantity is not None:
        limits["memory_available_bytes"] = memory.quantity
    nodefs = thresholds.get("nodefs.available")
    if nodefs is not None and nodefs.fraction is not None:
        limits["nodefs_available_fraction"] = nodefs.fraction
    pids = thresholds.get("pid.available")
    if pids is not None and pids.fraction is not None:
        limits["pid_available_fraction"] = pids.fraction
    return PressureThresholds(**limits)


def reserved_for_pods(config: Config) -> Reserved:
    """What [cgroups] kube_reserved and system_reserved keep from the node's allocatable."""
    total = reserved_total(config.cgroups.kube_reserved, config.cgroups.system_reserved)
    return Reserved(cpu_millis=total.cpu_millis, memory_bytes=total.memory_bytes)


@dataclass(frozen=True, slots=True)
class NodeSide:
    """What the cluster connection reads of the node that runs the pods, and tells it."""

    pod_config: PodConfig  # the API source goes in, the static pods come out
    pod_manager: PodManager
    status_manager: StatusManager
    object_store: ObjectStore  # the ConfigMaps and Secrets pods reference
    node_health: NodeHealth
    runtime_version: Callable[[], str | Awaitable[str]]  # the Node's containerRuntimeVersion
    runtime_features: Callable[[], RuntimeFeatures | None] = lambda: None
    pressure: Callable[[], Mapping[str, bool]] | None = None  # the eviction manager's conditions
    extended_resources: Callable[[], Mapping[str, tuple[int, int]]] = dict  # the device plugins' resources
    pod_cidr_handler: Callable[[str], Awaitable[None]] | None = None  # the Node's spec.podCIDR to the runtime
    could_have_running_containers: Callable[[str], bool] = lambda uid: False  # the pod records'
    recorder: EventRecorder | None = None


class ClusterConnection:
    def __init__(self, config: Config, node: NodeSide, *, node_ip: str, config_path: str = ""):
        """`config_path` is where a token join reads a new bootstrap token while its own is refused. Raises
        KubeconfigError (a ConfigError naming the file and field) for an unusable kubeconfig."""
        cluster = config.cluster
        if cluster is None:
            raise ValueError("ClusterConnection needs a config with a [cluster] section")
        node_name = config.node_name
        self.certificates = None
        if cluster.bootstrap_token:
            from edgelet.bootstrap.manager import ClientCertificateManager

            self.certificates = ClientCertificateManager(cluster, node_name, config.pki_dir, config_path=config_path,
                                                         state_dir=config.state_dir)
            self.client = ApiClient(cluster.server, tls=self.certificates.tls_context())
        else:
            self.client = ApiClient.from_kubeconfig(cluster.kubeconfig)
        pod_config = self._pod_config = node.pod_config
        self._tasks: TaskGroup | None = None
        self._api_tasks_started = False
        self._on_joined: list[Callable[[], None]] = []
        self.objects = ObjectSyncer(self.client, node.object_store, os.path.join(config.cache_dir, "objects"),
                                    refresh=OBJECTS_REFRESH)
        self.pod_checkpoints = PodCheckpoints(os.path.join(config.cache_dir, "pods"), node_name)
        self.caching = CachingHandle(pod_config.source(API_SOURCE), self.pod_checkpoints,
                                     before_apply=self._prepare_pods)
        root_dir = config.root_dir
        report = NodeReport(
            facts=lambda: asyncio.to_thread(gather_node_info, root_dir, hostname=node_name, node_ip=node_ip),
            node_health=node.node_health,
            runtime_version=node.runtime_version,
            runtime_features=node.runtime_features,
            pressure=node.pressure,
            extended_resources=node.extended_resources,
            thresholds=pressure_thresholds(config.eviction),
            reserved=reserved_for_pods(config),
            max_pods=config.max_pods,
            daemon_port=config.kubelet_api.port,
            pod_cidr_handler=node.pod_cidr_handler,
        )
        self.api = ClusterApi(self.client, node_name, cluster, report=report, api_pods=self.caching,
                              pod_manager=node.pod_manager, status_manager=node.status_manager, static=pod_config,
                              recorder=node.recorder, could_have_running_containers=node.could_have_running_containers)
        self.node_status = self.api.node_status
        self.status = self.api.status
        source = self.source = self.api.source
        host, port = api_server_address(self.client.server, cluster.kubernetes_service_host,
                                        cluster.kubernetes_service_port)
        self.services = ServiceInformer(self.client, master=kubernetes_service(host, port),
                                        api_answers=lambda: source.connected)
        self.tunnel = None
        if cluster.tunnel is not None:
            from edgelet.tunnel.wiring import build_tunnel

            self.tunnel = build_tunnel(config, node_ip=node_ip, certificates=self.certificates)
            self.api.when_link_back(self.tunnel.reconnect_now)

    def start(self, tasks: TaskGroup) -> None:
        """Restores the cached ConfigMaps, Secrets and pods (before anything connects), then starts the tasks."""
        self._tasks = tasks
        self.objects.load()
        restored = self.caching.restore()
        self.objects.set_pods(restored)
        if self.certificates is None or self.certificates.valid():
            self._start_api_tasks()
        if self.certificates is not None:
            tasks.start("cluster:certificates", self.certificates.run(self._use_certificate))

    def _start_api_tasks(self) -> None:
        tasks = self._tasks
        if tasks is None:
            raise RuntimeError("the cluster's API work starts only once the connection runs")
        self._api_tasks_started = True
        tasks.start("cluster:objects", self.objects.run())
        tasks.start("cluster:services", self.services.run())
        self.api.start(tasks, "cluster")
        if self.tunnel is not None:
            tasks.start("cluster:tunnel", self.tunnel.run())
        for callback in self._on_joined:
            callback()
        self._on_joined.clear()

    async def _prepare_pods(self, pods: list[Pod]) -> None:
        """Before new API pods are handed on: what they reference read, and the Services listed once (each wait
        bounded, and over when the API server fails to answer)."""
        await asyncio.gather(self.objects.ensure(pods, OBJECTS_WAIT), self.services.wait_synced(OBJECTS_WAIT))

    def when_joined(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once the node talks to the API server with credentials of its own (at once with a
        kubeconfig or a valid stored certificate; after the bootstrap otherwise)."""
        if self._api_tasks_started:
            callback()
        else:
            self._on_joined.append(callback)

    @property
    def cluster_ca(self) -> bytes | None:
        """The cluster CA of a bootstrap token join (None with a kubeconfig, or before discovery)."""
        return self.certificates.ca_pem if self.certificates is not None else None

    def _use_certificate(self) -> None:
        """A new client certificate (bootstrap or rotation): new connections use it; the API work starts
        with the first one. Running requests and the pod watch go on undisturbed."""
        if self.certificates is not None:  # always: they call this
            self.client.use_tls(self.certificates.tls_context())
        if not self._api_tasks_started:
            self._start_api_tasks()

    def pod_terminated(self, pod: Pod) -> None:
        """Call when every container of `pod` has stopped and its runtime pieces are removed."""
        self.status.pod_terminated(pod)

    def health(self) -> tuple[bool, str]:
        """The "API sync" check. Being offline is a state edgelet rides through, not a failure: it fails only
        when a cluster task crashed or the API server refuses our credentials."""
        crashed = sorted(name for name in (self._tasks.crashed if self._tasks else {}) if name.startswith("cluster:"))
        if crashed:
            return False, f"{', '.join(crashed)} crashed"
        if self.certificates is not None and not self._api_tasks_started:
            problem = self.certificates.problem()
            if problem:
                return False, f"no client certificate: {problem}"
            return True, (f"waiting for a client certificate from {self.client.server}; running "
                          f"{len(self._pod_config.get_pods())} pods from the cache")
        if isinstance(self.status.last_error, Unauthorized):
            return False, f"the API server refuses edgelet's credentials: {self.status.last_error.message}"
        pending = self.status.pending
        if self.source.connected:
            # A 403 for one object is that object's trouble (logged once, named there), not the agent's.
            refused = len(self.status.refusals)
            refusals = f"; the API server refuses {refused} mirror pods or statuses (see the log)" if refused else ""
            return True, f"connected to {self.client.server}; {pending} pod status updates pending{refusals}"
        since = self.source.last_sync
        offline = f"for {time.time() - since:.0f}s" if since else "since start"
        return True, (f"API server {self.client.server} unreachable {offline}; running "
                      f"{len(self._pod_config.get_pods())} pods from the cache, {pending} status updates pending")

    async def flush_statuses(self, timeout: float) -> None:
        """Waits (at most `timeout`) until every pending pod status reached the API server."""
        deadline = time.monotonic() + timeout
        while self.status.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        """Call after the tasks were cancelled."""
        await self.caching.close()
        await self.client.aclose()
