"""One hollow node: the agent's own Node registration and status, Lease, API pod source, pod status sync and
events, wired by the same `edgelet.cluster.clusterapi.ClusterApi` as the agent's cluster connection, over the in-memory
`HollowRuntime`.

Machine facts and health are constants (a healthy node that never changes), so whatever the control plane
sees from a hollow node is what the control-plane code sends, not noise from the simulating machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import platform
import random
from dataclasses import dataclass
from typing import Any

from edgelet import __version__
from edgelet.cluster.clusterapi import ClusterApi
from edgelet.config import ClusterConfig
from edgelet.events import NORMAL, EventRecorder, node_ref
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import AlreadyExists, ApiError, Forbidden, Invalid, NotFound, Unauthorized
from edgelet.nodestatus.health import NodeHealth
from edgelet.nodestatus.manager import NodeReport
from edgelet.nodestatus.setters import NodeInfo
from edgelet.pod.manager import PodManager
from edgelet.podconfig.config import PodConfig
from edgelet.simulate.runtime import HollowRuntime
from edgelet.status.manager import StatusManager
from edgelet.util.retry import Retrier
from edgelet.util.tasks import TaskGroup

log = logging.getLogger(__name__)

GiB = 1024 ** 3


def _ok() -> tuple[bool, str]:
    return True, "ok"


HEALTHY = NodeHealth({"runtime": _ok, "pleg": _ok})  # every hollow node's, shared
RUNTIME_VERSION = f"hollow://{__version__}"
HOLLOW_LABEL = "edgelet.io/hollow"


@dataclass(frozen=True, slots=True)
class Timings:
    """The cluster timings of every hollow node: the kubelet's defaults unless the caller shortens them."""

    lease_duration: float = 40.0
    lease_renew_interval: float = 10.0
    node_status_update_frequency: float = 10.0
    node_status_report_frequency: float = 300.0
    status_resync: float = 10.0

    def cluster_config(self) -> ClusterConfig:
        """The agent's [cluster] settings these timings stand for."""
        return ClusterConfig(lease_duration=self.lease_duration, lease_renew_interval=self.lease_renew_interval,
                             node_status_update_frequency=self.node_status_update_frequency,
                             node_status_report_frequency=self.node_status_report_frequency,
                             status_resync=self.status_resync)


def hollow_facts(node_name: str) -> NodeInfo:
    """A mid-size edge device that never changes; the IDs are stable per node name."""
    digest = hashlib.sha256(node_name.encode()).hexdigest()
    return NodeInfo(
        hostname=node_name,
        kernel_version=platform.release(),
        os_image="edgelet hollow node",
        cpu_count=4,
        memory_bytes=8 * GiB,
        memory_available_bytes=6 * GiB,
        fs_capacity_bytes=64 * GiB,
        fs_available_bytes=48 * GiB,
        pid_max=4_194_304,
        pids_in_use=200,
        boot_id=f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
        machine_id=digest[:32],
        system_uuid=digest[32:64],
    )


def workload_pod(node_name: str, index: int, namespace: str) -> dict[str, Any]:
    """The `index`-th pod the simulator binds to a hollow node for --pods-per-node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{node_name}-{index}", "namespace": namespace, "labels": {HOLLOW_LABEL: "true"}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "image": "registry.local/hollow:1"}],
            # Hollow pods follow their node through outages rather than being evicted from it.
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
        },
    }


class HollowNode:
    def __init__(self, name: str, client: ApiClient, *, state_dir: str, timings: Timings, rng: random.Random):
        self.name = name
        self.client = client
        self._rng = rng
        self.pod_config = PodConfig()
        # Events go to the API only (no local event log), through the agent's recorder and correlator.
        self.recorder = EventRecorder(name, None)
        # The local status store is never flushed to disk: only its API half matters to the control plane.
        self.status = StatusManager(os.path.join(state_dir, name))
        facts = hollow_facts(name)
        report = NodeReport(facts=lambda: facts, node_health=HEALTHY, runtime_version=lambda: RUNTIME_VERSION)
        # A hollow node has no static pods, so no mirror pods of its own; its pod manager only pairs them.
        self.api = ClusterApi(client, name, timings.cluster_config(), report=report,
                              api_pods=self.pod_config.source("api"), pod_manager=PodManager(),
                              status_manager=self.status, recorder=self.recorder, rng=rng)
        self.node_status = self.api.node_status
        self.lease = self.api.lease
        self.source = self.api.source
        self.syncer = self.api.status
        self.runtime = HollowRuntime(self.pod_config, self.status, on_terminated=self.syncer.pod_terminated,
                                     recorder=self.recorder)

    def start(self, tasks: TaskGroup, *, pods: int = 0, namespace: str = "default") -> None:
        self.api.start(tasks, self.name)
        tasks.start(f"{self.name}:runtime", self.runtime.run())
        tasks.start(f"{self.name}:recorder", self.recorder.run())
        self.recorder.event(node_ref(self.name), NORMAL, "Starting", "Starting kubelet.")
        if pods:
            tasks.start(f"{self.name}:workload", self.create_workload(pods, namespace))

    async def create_workload(self, count: int, namespace: str) -> None:
        """Binds `count` pods to this node once it is registered (existing ones are kept)."""
        await self.node_status.registered.wait()
        retry = Retrier(f"hollow node {self.name}: creating its workload pods", initial=1.0, maximum=30.0,
                        rng=self._rng, logger=log)
        index = 0
        while index < count:
            try:
                await self.client.create(f"/api/v1/namespaces/{namespace}/pods",
                                         workload_pod(self.name, index, namespace))
            except AlreadyExists:
                pass
            except (Invalid, NotFound, Unauthorized, Forbidden) as e:  # retrying cannot help
                log.error("hollow node %s: the API server refuses its workload pods: %s", self.name, e)
                return
            except ApiError as e:
                await asyncio.sleep(retry.failed(e, f"pod {index} of {count} not created"))
                continue
            retry.succeeded()
            index += 1
