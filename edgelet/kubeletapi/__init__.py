"""The kubelet API on :10250 (logs, exec, attach, port-forward, run, stats, metrics) for cluster mode.

Imported only when a `[cluster]` is configured: standalone nodes never load its TLS and review code.
`build_server` wires it from the pieces of the agent it reads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from edgelet.api import podutil
from edgelet.cadvisor.cgroupfs import CgroupReader
from edgelet.cadvisor.collector import CadvisorCollector, ContainerFacts
from edgelet.config import Config
from edgelet.container.runtime import ContainerState, PodRuntimeStatus, SandboxState, SandboxStatus
from edgelet.kubeapi.kubeconfig import load_kubeconfig
from edgelet.metrics import registry as metrics
from edgelet.server.http import HealthCheck

from .auth import Authenticator, Authorizer
from .certs import ensure_self_signed, server_context
from .paths import BadRequest, Route
from .server import KubeletApiServer, NodeView, NotFoundError
from .stats import SummaryProvider

if TYPE_CHECKING:
    from edgelet.pod.manager import PodManager

__all__ = ["KubeletApiServer", "NodeView", "PodLookup", "build_server"]


class PodLookup:
    """Finds the pod, container and sandbox a path names among the agent's pods and their runtime state."""

    def __init__(self, node_name: str, pod_manager: PodManager,
                 runtime_status: Callable[[str], PodRuntimeStatus]) -> None:
        self._node_name = node_name
        self._pods = pod_manager
        self._runtime_status = runtime_status

    def pod_uid(self, route: Route) -> str:
        # A caller knows a static pod only by its mirror pod's uid (all the API shows); the runtime only by the
        # static pod's own. The kubelet translates first too (TranslatePodUID in findContainer).
        wanted = self._pods.translate_pod_uid(route.uid)
        for uid, pod in self._pods.pods().items():
            if podutil.namespace(pod) != route.namespace or (wanted and wanted != uid):
                continue
            if podutil.name(pod) in (route.pod, f"{route.pod}-{self._node_name}"):
                return uid
        raise NotFoundError(f'pod "{route.pod}" not found in namespace "{route.namespace}" on this node')

    def container(self, route: Route) -> str:
        status = self._runtime_status(self.pod_uid(route)).latest_container(route.container)
        if status is None:
            raise NotFoundError(f'container "{route.container}" not found in pod "{route.pod}"')
        if status.state != ContainerState.RUNNING:
            raise BadRequest(f'container "{route.container}" in pod "{route.pod}" is not running')
        return status.id

    def sandbox(self, route: Route) -> str:
        sandbox = self.ready_sandbox(self.pod_uid(route))
        if sandbox is None:
            raise NotFoundError(f'pod "{route.pod}" has no running sandbox')
        return sandbox.id

    def ready_sandbox(self, pod_uid: str) -> SandboxStatus | None:
        return next((s for s in self._runtime_status(pod_uid).sandboxes if s.state == SandboxState.READY), None)

    def container_running(self, pod_uid: str, name: str) -> bool:
        status = self._runtime_status(pod_uid).latest_container(name)
        return status is not None and status.state == ContainerState.RUNNING

    def container_facts(self) -> dict[str, ContainerFacts]:
        """The image and start time of every container of the node's pods, by id (for /metrics/cadvisor)."""
        return {status.id: ContainerFacts(status.image, status.started_at)
                for uid in self._pods.uids() for status in self._runtime_status(uid).containers}

    def container_start(self, container_id: str) -> int:
        for uid in self._pods.uids():
            for status in self._runtime_status(uid).containers:
                if status.id == container_id:
                    return status.started_at
        return 0


def build_server(
    config: Config, *, runtime: Any, review: Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]],
    lookup: PodLookup, pods_json: Callable[[], bytes], health_checks: Mapping[str, HealthCheck],
    node_ip: str, cluster_ca: bytes | None = None, serving_cert: str | None = None,
    claimed_volumes: Callable[[str], list[Any]] = lambda pod_uid: [],
    csi_volume_stats: Callable[[str], Awaitable[dict[str, int] | None]] | None = None,
) -> KubeletApiServer:
    """The server for config.kubelet_api; raises TLSSetupError or KubeconfigError naming the setting at fault."""
    settings = config.kubelet_api
    cert_file, key_file = settings.tls_cert_file, settings.tls_private_key_file
    if serving_cert:  # one file holding key and certificate, from the kubelet-serving signer
        cert_file = key_file = serving_cert
    elif not cert_file:
        cert_file, key_file = ensure_self_signed(os.path.join(config.root_dir, "pki"), config.node_name,
                                                 [node_ip, "127.0.0.1"])
    ca_data = None
    if not settings.client_ca_file and config.cluster is not None and not config.cluster.kubeconfig:
        ca_data = cluster_ca  # a bootstrap token join: its ca_file or the discovered CA
    elif not settings.client_ca_file and config.cluster is not None:
        kubeconfig = load_kubeconfig(config.cluster.kubeconfig)
        ca_data = kubeconfig.ca_data
        if ca_data is None and kubeconfig.ca_file:
            settings = dataclasses.replace(settings, client_ca_file=kubeconfig.ca_file)
    context = server_context(cert_file, key_file, client_ca_file=settings.client_ca_file, client_ca_data=ca_data)
    stats = SummaryProvider(runtime, node_name=config.node_name, root_dir=config.root_dir, logs_dir=config.logs_dir,
                            container_start=lookup.container_start, pod_sandbox=lookup.ready_sandbox,
                            claimed_volumes=claimed_volumes, csi_volume_stats=csi_volume_stats)
    cadvisor = CadvisorCollector(runtime, container_facts=lookup.container_facts,
                                 cgroups=CgroupReader(cgroup_root=config.cgroups.root))
    node = NodeView(
        node_name=config.node_name, logs_dir=config.logs_dir, runtime=runtime,
        find_container=lookup.container, find_sandbox=lookup.sandbox, container_running=lookup.container_running,
        pods_json=pods_json, health_checks=health_checks, summary=stats.summary,
        metrics=metrics.exposition, probe_metrics=metrics.probes_exposition, cadvisor=cadvisor.scrape,
        node_log_dir=config.kubelet_api.node_log_dir, journal_dir=config.kubelet_api.journal_dir,
    )
    return KubeletApiServer(settings.address, ssl_context=context, node=node,
                            authenticator=Authenticator(review, anonymous=settings.anonymous),
                            authorizer=Authorizer(review))
