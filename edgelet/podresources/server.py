"""The kubelet's pod resources API (v1.PodResourcesLister) on its unix socket: which devices and exclusive CPUs each
container of the active pods holds, and what the node can give (dcgm-exporter and other monitoring agents read it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.metrics import registry as metrics
from edgelet.podresources import podresources_v1_pb2 as api
from edgelet.podresources import podresources_v1_pb2_grpc as api_grpc

SERVER_API_VERSION = "v1"

requests_total = metrics.Counter(
    "kubelet_pod_resources_endpoint_requests_total",
    "Cumulative number of requests to the PodResource endpoint, by server API version.",
    ["server_api_version"],
    registry=metrics.REGISTRY,
)
requests_by_call = {
    call: metrics.Counter(
        f"kubelet_pod_resources_endpoint_requests_{call}",
        f"Number of requests to the PodResource {call} endpoint, by server API version.",
        ["server_api_version"],
        registry=metrics.REGISTRY,
    )
    for call in ("list", "get_allocatable", "get")
}


@dataclass(frozen=True, slots=True)
class ResourceSources:
    """Where the answers come from: the active pods, each container's devices (resource -> device ids) and
    exclusive CPUs, every healthy device (resource -> ids), the allocatable CPUs and a device's NUMA nodes."""

    active_pods: Callable[[], Iterable[Pod]]
    container_devices: Callable[[str, str], dict[str, tuple[str, ...]]]
    container_cpus: Callable[[str, str], Iterable[int]]
    allocatable_devices: Callable[[], dict[str, frozenset[str]]]
    allocatable_cpus: Callable[[], Iterable[int]]
    topology: Callable[[str, str], tuple[int, ...]]


def _devices(sources: ResourceSources, resource: str, ids: Iterable[str]) -> list[api.ContainerDevices]:
    """One entry for all the ids when none has a NUMA node, else one per device with its nodes."""
    ids = sorted(ids)
    if not any(sources.topology(resource, device) for device in ids):
        return [api.ContainerDevices(resource_name=resource, device_ids=ids)]
    return [api.ContainerDevices(resource_name=resource, device_ids=[device], topology=api.TopologyInfo(
        nodes=[api.NUMANode(ID=node) for node in sources.topology(resource, device)])) for device in ids]


def pod_resources(pod: Pod, sources: ResourceSources) -> api.PodResources:
    """A pod's entry: its app containers and sidecars (restartable init containers), as the kubelet lists them."""
    uid = podutil.uid(pod)
    containers = [c for c in podutil.init_containers(pod) if podutil.is_sidecar(c)] + podutil.containers(pod)
    entry = api.PodResources(name=podutil.name(pod), namespace=podutil.namespace(pod))
    for container in containers:
        name = container.get("name", "")
        resources = api.ContainerResources(name=name, cpu_ids=sorted(sources.container_cpus(uid, name)))
        for resource, ids in sorted(sources.container_devices(uid, name).items()):
            resources.devices.extend(_devices(sources, resource, ids))
        entry.containers.append(resources)
    return entry


class PodResourcesServer(api_grpc.PodResourcesListerServicer):
    def __init__(self, sources: ResourceSources):
        self._sources = sources

    def _count(self, call: str) -> None:
        requests_total.labels(SERVER_API_VERSION).inc()
        requests_by_call[call].labels(SERVER_API_VERSION).inc()

    async def List(self, request, context):
        self._count("list")
        return api.ListPodResourcesResponse(
            pod_resources=[pod_resources(pod, self._sources) for pod in self._sources.active_pods()])

    async def GetAllocatableResources(self, request, context):
        self._count("get_allocatable")
        response = api.AllocatableResourcesResponse(cpu_ids=sorted(self._sources.allocatable_cpus()))
        for resource, ids in sorted(self._sources.allocatable_devices().items()):
            if ids:
                response.devices.extend(_devices(self._sources, resource, ids))
        return response

    async def Get(self, request, context):
        self._count("get")
        for pod in self._sources.active_pods():
            if podutil.name(pod) == request.name and podutil.namespace(pod) == request.namespace:
                return api.GetPodResourcesResponse(pod_resources=pod_resources(pod, self._sources))
        await context.abort(grpc.StatusCode.NOT_FOUND,
                            f"pod {request.name} in namespace {request.namespace} not found")


def add_to_server(server, sources: ResourceSources) -> None:
    api_grpc.add_PodResourcesListerServicer_to_server(PodResourcesServer(sources), server)
