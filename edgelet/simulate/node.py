"""One hollow node: the agent's own Node registration and status, Lease, API pod source and pod status sync,
wired as `edgelet.cluster.ClusterConnection` wires them, over the in-memory `HollowRuntime`.

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
from edgelet.backoff import jittered_delays
from edgelet.cluster import _MirrorSplitter
from edgelet.events import NORMAL, EventRecorder, node_ref
from edgelet.events.apisink import ApiEventSink
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import AlreadyExists, ApiError, Forbidden, Invalid, NotFound, Unauthorized
from edgelet.nodestatus.lease import LeaseController
from edgelet.nodestatus.manager import NodeStatusManager
from edgelet.nodestatus.setters import NodeInfo
from edgelet.podconfig.apiserver import ApiServerSource
from edgelet.podconfig.config import PodConfig
from edgelet.podmanager import PodManager
from edgelet.simulate.runtime import HollowRuntime
from edgelet.status.apisync import StatusSyncer
from edgelet.status.manager import StatusManager
from edgelet.tasks import TaskGroup

log = logging.getLogger(__name__)

GiB = 1024 ** 3
HEALTHY = {"runtime": (True, "ok"), "pleg": (True, "ok")}
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
        self.events = ApiEventSink(client)
        self.recorder.add_sink(self.events)
        # The local status store is never flushed to disk: only its API half matters to the control plane.
        self.status = StatusManager(os.path.join(state_dir, name))
        facts = hollow_facts(name)
        self.node_status = NodeStatusManager(
            client, name,
            facts_provider=lambda: facts,
            health_provider=lambda: HEALTHY,
            runtime_version_provider=lambda: RUNTIME_VERSION,
            update_frequency=timings.node_status_update_frequency,
            report_frequency=timings.node_status_report_frequency,
            rng=rng,
            recorder=self.recorder,
        )
        self.lease = LeaseController(client, name, duration=timings.lease_duration,
                                     renew_interval=timings.lease_renew_interval, rng=rng,
                                     on_lapse_ended=self.node_status.reconcile_with_server)
        self.syncer = StatusSyncer(
            client, name, self.status, PodManager(),
            resync=timings.status_resync,
            backoff_max=max(timings.status_resync, 0.5),
            api_pod=self.pod_config.get_pod,
            node_uid=lambda: self.node_status.node_uid,
            rng=rng,
        )
        self.source = ApiServerSource(client, name, _MirrorSplitter(self.pod_config.source("api"),
                                                                    self.syncer.set_mirror_pods), rng=rng)
        self.runtime = HollowRuntime(self.pod_config, self.status, on_terminated=self.syncer.pod_terminated,
                                     recorder=self.recorder)

    def start(self, tasks: TaskGroup, *, pods: int = 0, namespace: str = "default") -> None:
        tasks.start(f"{self.name}:pod-source", self.source.run())
        tasks.start(f"{self.name}:node-status", self.node_status.run())
        tasks.start(f"{self.name}:lease", self.lease.run())
        tasks.start(f"{self.name}:pod-status", self.syncer.run())
        tasks.start(f"{self.name}:runtime", self.runtime.run())
        tasks.start(f"{self.name}:events", self.recorder.run())
        tasks.start(f"{self.name}:events-api", self.events.run())
        self.recorder.event(node_ref(self.name), NORMAL, "Starting", "Starting kubelet.")
        if pods:
            tasks.start(f"{self.name}:workload", self.create_workload(pods, namespace))

    async def create_workload(self, count: int, namespace: str) -> None:
        """Binds `count` pods to this node once it is registered (existing ones are kept)."""
        await self.node_status.registered.wait()
        delays = None
        index = 0
        while index < count:
            try:
                await self.client.create(f"/api/v1/namespaces/{namespace}/pods", workload_pod(self.name, index, namespace))
            except AlreadyExists:
                pass
            except (Invalid, NotFound, Unauthorized, Forbidden) as e:  # retrying cannot help
                log.error("hollow node %s: the API server refuses its workload pods: %s", self.name, e)
                return
            except ApiError as e:
                delays = delays or jittered_delays(1.0, 30.0, rng=self._rng)
                log.debug("hollow node %s: creating pod %d failed: %s", self.name, index, e)
                await asyncio.sleep(next(delays))
                continue
            delays = None
            index += 1
