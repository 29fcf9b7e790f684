"""The device manager (the kubelet's cm/devicemanager): device plugins register on `<plugin dir>/kubelet.sock`, each
one's devices and their health come from its ListAndWatch stream, pods are admitted by giving each container its
devices (recorded in the checkpoint), and a container is created with what the plugin's Allocate answer says.

A plugin whose stream ends is dropped: its devices stay in the node's capacity with none allocatable for 5 minutes
(the kubelet's endpointStopGracePeriod), then the resource is reported as 0. A restarted plugin registers again and
replaces the old registration; a second plugin for a resource whose plugin still serves is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence

import orjson

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2 as api
from edgelet.cm.devicemanager.allocation import (
    ADMISSION_REASON,
    HEALTHY,
    AllocationError,
    Assignment,
    ResourceCount,
    RunOptions,
    admission_message,
    devices_in_use,
    extended_requests,
    missing_resource_problem,
    node_resources,
    plan_pod,
    prefer,
    resource_name_error,
    run_options,
)
from edgelet.cm.devicemanager.checkpoint import DeviceCheckpoint, DeviceState
from edgelet.cm.devicemanager.endpoint import SUPPORTED_VERSIONS, Endpoint, PluginCallError
from edgelet.cm.devicemanager.record import record_path
from edgelet.metrics import registry as metrics
from edgelet.util.checkpoint import replace_file
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
ENDPOINT_STOP_GRACE = 300.0  # the kubelet's endpointStopGracePeriod
HOUSEKEEPING_PERIOD = 30.0
# How often the plugins' sockets are looked at while plugins are registered: one whose socket was removed is dropped
# even while its process (and so its stream) lives on.
SOCKET_CHECK_PERIOD = 5.0

registrations = metrics.Counter(
    "kubelet_device_plugin_registration_total",
    "Cumulative number of device plugin registrations, by resource name.",
    ["resource_name"],
    registry=metrics.REGISTRY,
)
allocation_duration = metrics.Histogram(
    "kubelet_device_plugin_alloc_duration_seconds",
    "Duration in seconds to serve a device plugin Allocate request, by resource name.",
    ["resource_name"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=metrics.REGISTRY,
)


class RegistrationError(Exception):
    """A registration refused; `code` is the gRPC status code name the plugin gets."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class DeviceError(EdgeletError):
    """A container's devices cannot be handed to it now (its plugin is away or failed): the container waits
    with CreateContainerConfigError and is tried again."""


class DeviceManager:
    """`active_pods()` are the pods admitted and not terminated; before `sources_ready()` a pod missing from them
    may only be late, so its devices are kept."""

    def __init__(self, plugin_dir: str, *, state_dir: str, active_pods: Callable[[], Iterable[Pod]],
                 sources_ready: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.monotonic,
                 stop_grace: float = ENDPOINT_STOP_GRACE, socket_check_period: float = SOCKET_CHECK_PERIOD):
        self.plugin_dir = plugin_dir
        self.socket_path = os.path.join(plugin_dir, KUBELET_SOCKET)
        self._record_path = record_path(state_dir)
        self._active_pods = active_pods
        self._sources_ready = sources_ready
        self._clock = clock
        self._stop_grace = stop_grace
        self._socket_check_period = socket_check_period
        self._checkpoint: DeviceCheckpoint | None = None
        self._state = DeviceState()
        self._endpoints: dict[str, Endpoint] = {}  # resource -> the plugin serving it now
        self._serving: dict[str, asyncio.Task] = {}  # resource -> the task following its plugin
        self._devices: dict[str, dict[str, str]] = {}  # resource -> device id -> health, as last reported
        self._topology: dict[str, dict[str, tuple[int, ...]]] = {}  # resource -> device id -> NUMA nodes
        self._stopped_at: dict[str, float] = {}  # resources whose plugin went away (or is not back yet): since
        self._removed: set[str] = set()  # resources whose grace period ended: reported as 0
        self._wake = asyncio.Event()
        self._record: bytes = b""
        self._inactive: set[str] = set()  # pods holding devices that the last housekeeping pass found inactive
        self._deferred: set[str] = set()  # static pods admitted before their plugins served: they wait for devices

    # -- life -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Reads the checkpoint and clears the plugin directory of sockets: kubelet.sock is made anew when the
        server binds, which tells the plugins (they watch for it) to register again. Raises EdgeletError when the
        directory cannot be used."""
        try:
            os.makedirs(self.plugin_dir, mode=0o750, exist_ok=True)
            self._checkpoint = DeviceCheckpoint(self.plugin_dir)
            self._state = self._checkpoint.load()
        except OSError as exc:
            raise EdgeletError(f"device manager: cannot use the plugin directory {self.plugin_dir} "
                               f"([devices] plugin_dir): {exc.strerror or exc}") from None
        now = self._clock()
        for resource, ids in self._state.registered.items():
            # Known from before: counted in the capacity, none allocatable until the plugin is back.
            self._devices[resource] = dict.fromkeys(ids, "Unhealthy")
            self._stopped_at[resource] = now
        for uid, containers in self._state.pod_devices.items():
            for container, resources in containers.items():
                for resource, assignment in resources.items():
                    log.info("device manager: pod %s container %s keeps %s %s from the checkpoint", uid, container,
                             resource, ",".join(assignment.device_ids))
        self._remove_sockets()
        self._write_record()

    def _remove_sockets(self) -> None:
        try:
            names = os.listdir(self.plugin_dir)
        except OSError as exc:
            log.warning("device manager: cannot list %s: %s", self.plugin_dir, exc)
            return
        for name in names:
            path = os.path.join(self.plugin_dir, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("device manager: cannot remove the stale socket %s: %s", path, exc)

    async def run(self) -> None:
        """Drops plugins whose socket is gone, ends the grace period of plugins that went away, and releases the
        devices of pods no longer active."""
        next_housekeeping = 0.0
        while True:
            self._wake.clear()
            self._check_sockets()
            self._expire()
            if self._clock() >= next_housekeeping:
                self._release_inactive()
                next_housekeeping = self._clock() + HOUSEKEEPING_PERIOD
            delays = [at + self._stop_grace - self._clock() for at in self._stopped_at.values()]
            if self._endpoints:
                delays.append(self._socket_check_period)
            try:
                await asyncio.wait_for(self._wake.wait(), max(min([HOUSEKEEPING_PERIOD, *delays]), 0.05))
            except TimeoutError:
                pass

    async def close(self) -> None:
        tasks = list(self._serving.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._serving.clear()

    # -- registration ---------------------------------------------------------------------------------------

    def register(self, request: api.RegisterRequest) -> None:
        """Accepts a plugin's registration and starts following it; raises RegistrationError saying why not."""
        resource = request.resource_name
        if request.version not in SUPPORTED_VERSIONS:
            raise RegistrationError("INVALID_ARGUMENT", f"requested API version {request.version!r} is not supported "
                                    f"by edgelet; supported versions are {list(SUPPORTED_VERSIONS)}")
        if problem := resource_name_error(resource):
            raise RegistrationError("INVALID_ARGUMENT", problem)
        endpoint_name = request.endpoint
        if not endpoint_name or "/" in endpoint_name or endpoint_name in (".", "..", KUBELET_SOCKET):
            raise RegistrationError("INVALID_ARGUMENT", f"endpoint {endpoint_name!r} must be the name of the "
                                    f"plugin's socket in {self.plugin_dir}")
        socket_path = os.path.join(self.plugin_dir, endpoint_name)
        current = self._endpoints.get(resource)
        if current is not None and current.socket_path != socket_path and os.path.exists(current.socket_path):
            raise RegistrationError("ALREADY_EXISTS", f"resource {resource} is already registered by the device "
                                    f"plugin at {current.socket_path}, which still serves; stop it first")
        previous = self._serving.pop(resource, None)
        if previous is not None:
            previous.cancel()
            log.info("device manager: %s registers again; the earlier registration is replaced", resource)
        endpoint = Endpoint(resource, socket_path, request.options)
        self._endpoints[resource] = endpoint
        self._serving[resource] = asyncio.get_running_loop().create_task(
            self._follow(endpoint), name=f"device-plugin {resource}")
        registrations.labels(resource).inc()
        self._wake.set()  # its socket is looked at from now on
        log.info("device manager: device plugin %s registered at %s", resource, socket_path)

    async def _follow(self, endpoint: Endpoint) -> None:
        resource = endpoint.resource
        try:
            try:
                await endpoint.connect()
                reason = await endpoint.list_and_watch(lambda devices: self._update(endpoint, devices))
            except PluginCallError as exc:
                reason = str(exc)
            if self._endpoints.get(resource) is endpoint:
                self._plugin_gone(endpoint, reason)
        finally:
            await endpoint.close()
            if self._serving.get(resource) is asyncio.current_task():
                del self._serving[resource]

    def _update(self, endpoint: Endpoint, devices: Sequence[api.Device]) -> None:
        resource = endpoint.resource
        if self._endpoints.get(resource) is not endpoint:
            return
        health = {device.ID: device.health for device in devices}
        self._topology[resource] = {device.ID: tuple(node.ID for node in device.topology.nodes)
                                    for device in devices if device.HasField("topology")}
        changed = self._devices.get(resource) != health or resource in self._stopped_at
        self._stopped_at.pop(resource, None)
        self._removed.discard(resource)
        if not changed:
            return
        self._devices[resource] = health
        healthy = sum(1 for h in health.values() if h == HEALTHY)
        log.info("device manager: %s has %d devices, %d healthy", resource, len(health), healthy)
        if sorted(health) != sorted(self._state.registered.get(resource, ())):
            self._state.registered[resource] = sorted(health)
            self._save("the devices of " + resource)
        self._write_record()

    def _plugin_gone(self, endpoint: Endpoint, reason: str) -> None:
        resource = endpoint.resource
        del self._endpoints[resource]
        self._stopped_at[resource] = self._clock()
        log.warning("device manager: device plugin %s at %s went away (%s); its devices are unavailable until it "
                    "registers again", resource, endpoint.socket_path, reason)
        self._write_record()
        self._wake.set()

    def _check_sockets(self) -> None:
        for resource, endpoint in list(self._endpoints.items()):
            if not os.path.exists(endpoint.socket_path):
                task = self._serving.pop(resource, None)
                if task is not None:
                    task.cancel()
                self._plugin_gone(endpoint, f"its socket {endpoint.socket_path} is gone")

    def _expire(self) -> None:
        now = self._clock()
        for resource, since in list(self._stopped_at.items()):
            if now - since >= self._stop_grace:
                del self._stopped_at[resource]
                if self._devices.pop(resource, None) is not None:
                    self._removed.add(resource)  # reported as 0 from now on
                self._topology.pop(resource, None)
                if self._state.registered.pop(resource, None) is not None:
                    self._save("the removal of " + resource)
                log.info("device manager: %s has had no plugin for %.0fs; removed from the node's resources",
                         resource, self._stop_grace)
                self._write_record()

    # -- what the node offers -------------------------------------------------------------------------------

    def capacity(self) -> dict[str, ResourceCount]:
        return node_resources(self._devices, serving=frozenset(filter(self._serves, self._endpoints)),
                              removed=self._removed)

    def node_resources(self) -> dict[str, tuple[int, int]]:
        """(capacity, allocatable) of each resource, for the Node's status."""
        return {name: (count.capacity, count.allocatable) for name, count in self.capacity().items()}

    def healthy_devices(self) -> dict[str, frozenset[str]]:
        """Each resource a plugin offers or offered (in this agent's life or before it, as the checkpoint says),
        with the devices it reports healthy now (none while it is away)."""
        return {resource: frozenset(d for d, h in health.items() if h == HEALTHY)
                if self._serves(resource) else frozenset()
                for resource, health in self._devices.items()}

    def topology(self, resource: str, device: str) -> tuple[int, ...]:
        return self._topology.get(resource, {}).get(device, ())

    def _write_record(self) -> None:
        record = orjson.dumps({
            "resources": {name: {"capacity": count.capacity, "allocatable": count.allocatable,
                                 "plugin": self._endpoints[name].socket_path if name in self._endpoints else ""}
                          for name, count in sorted(self.capacity().items())},
        })
        if record == self._record:
            return
        try:
            os.makedirs(os.path.dirname(self._record_path), exist_ok=True)
            replace_file(self._record_path, record, temp=self._record_path + ".tmp", mode=0o644, exclusive=False,
                         durable=False)
            self._record = record
        except OSError as exc:
            log.warning("device manager: cannot write %s: %s", self._record_path, exc)

    # -- admission ------------------------------------------------------------------------------------------

    def admit(self, pod: Pod) -> tuple[bool, str, str]:
        """(admitted, reason, message) as the kubelet's resource allocation admit handler answers: every container
        is given its devices, or the pod is refused.

        A static pod (no scheduler placed it) that needs a plugin not serving yet is admitted without devices and
        waits for them at its first container's creation: on a device's boot its plugin (a static pod too, or a
        service) registers after the pods are admitted, and a refusal would be for good."""
        requested = {resource for container in podutil.all_containers(pod) for resource in extended_requests(container)}
        if not requested:
            return True, "", ""
        uid = podutil.uid(pod)
        held = {resource for resources in (self._state.pod_devices.get(uid) or {}).values() for resource in resources}
        if podutil.is_static(pod) and not all(self._serves(resource) for resource in requested - held):
            if uid not in self._deferred:
                self._deferred.add(uid)
                log.info("device manager: pod %s waits for the device plugins of %s", podutil.full_name(pod),
                         ", ".join(sorted(r for r in requested - held if not self._serves(r))))
            return True, "", ""
        # The kubelet's predicate: a resource the node reports as 0 (its plugin gone for good).
        if problem := missing_resource_problem(pod, lambda name: name in self._removed and name not in held):
            resource, message = problem
            return False, f"OutOf{resource}", message
        try:
            self._record_plan(pod)
        except AllocationError as exc:
            return False, ADMISSION_REASON, admission_message(exc)
        return True, "", ""

    def _serves(self, resource: str) -> bool:
        """A plugin serves the resource and has told its devices since it registered."""
        return resource in self._endpoints and resource in self._devices and resource not in self._stopped_at

    def _record_plan(self, pod: Pod) -> None:
        """Gives the pod's containers their devices and records them; raises AllocationError."""
        plan = plan_pod(pod, self._state.pod_devices, healthy=self.healthy_devices())
        uid = podutil.uid(pod)
        previous = self._state.pod_devices.get(uid)
        if not plan or plan == previous:
            return
        self._state.pod_devices[uid] = plan
        try:
            self._require_checkpoint().save(self._state)
        except OSError as exc:
            if previous is None:
                del self._state.pod_devices[uid]
            else:
                self._state.pod_devices[uid] = previous
            raise AllocationError(f"cannot record the device assignment in {self._require_checkpoint().path}: "
                                  f"{exc}") from None
        for container, resources in sorted(plan.items()):
            for resource, assignment in sorted(resources.items()):
                log.info("device manager: pod %s container %s gets %s %s", podutil.full_name(pod), container,
                         resource, ",".join(assignment.device_ids))

    def _plan_deferred(self, pod: Pod) -> None:
        """A waiting static pod gets its devices once its plugins serve; raises DeviceError while it must wait."""
        requested = {resource for container in podutil.all_containers(pod) for resource in extended_requests(container)}
        waiting = sorted(resource for resource in requested if not self._serves(resource))
        if waiting:
            raise DeviceError(f"waiting for the device plugin of {', '.join(waiting)} to register")
        try:
            self._record_plan(pod)
        except AllocationError as exc:
            raise DeviceError(f"{exc}; waiting for devices") from None
        self._deferred.discard(podutil.uid(pod))

    def remove(self, uid: str) -> None:
        """Frees the pod's devices (once it is terminated)."""
        self._deferred.discard(uid)
        if self._state.pod_devices.pop(uid, None) is not None:
            log.info("device manager: pod %s released its devices", uid)
            self._save("a release")

    def _release_inactive(self) -> None:
        """The kubelet's UpdateAllocatedDevices, for what no termination released (a pod deleted while the agent was
        down, one a later admission check refused): devices of pods found inactive by two passes in a row go back,
        once every source has told its pods. One pass is not enough: a source's pods count as told before the sync
        loop has admitted each of them."""
        if not self._state.pod_devices or not self._sources_ready():
            self._inactive = set()
            return
        inactive = set(self._state.pod_devices) - {podutil.uid(pod) for pod in self._active_pods()}
        for uid in sorted(inactive & self._inactive):
            self.remove(uid)
        self._inactive = inactive - self._inactive

    # -- container creation ---------------------------------------------------------------------------------

    async def container_options(self, pod: Pod, container: dict) -> RunOptions | None:
        """What the container's devices add to its CRI config (None: it has none). A static pod admitted before
        its plugins served gets its devices here. Asks the plugin for an Allocate answer only when none is recorded;
        calls PreStartContainer where the plugin asked for it. Raises DeviceError when the plugin is needed and away
        or fails, or the devices are not there yet."""
        uid, name = podutil.uid(pod), container.get("name", "")
        if uid in self._deferred:
            self._plan_deferred(pod)
        held = (self._state.pod_devices.get(uid) or {}).get(name)
        if not held:
            return None
        responses = []
        for resource, assignment in sorted(held.items()):
            if not assignment.response:
                assignment = await self._allocate(uid, name, resource, assignment)
            endpoint = self._endpoints.get(resource)
            if endpoint is not None and endpoint.options.pre_start_required:
                try:
                    await endpoint.pre_start(assignment.device_ids)
                except PluginCallError as exc:
                    raise DeviceError(str(exc)) from None
            responses.append(api.ContainerAllocateResponse.FromString(assignment.response))
        options = run_options(responses)
        for conflict in options.conflicts:
            log.warning("pod %s container %s: the device plugins set %s differently; the first is kept",
                        podutil.full_name(pod), name, conflict)
        return options

    async def _allocate(self, uid: str, container: str, resource: str, assignment: Assignment) -> Assignment:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise DeviceError(f"device plugin {resource} is not registered; cannot allocate devices "
                              f"{','.join(assignment.device_ids)}")
        devices = assignment.device_ids
        if endpoint.options.get_preferred_allocation_available:
            devices = await self._preferred(endpoint, uid, container, resource, assignment)
        started = time.monotonic()
        try:
            response = await endpoint.allocate(devices)
        except PluginCallError as exc:
            raise DeviceError(str(exc)) from None
        finally:
            allocation_duration.labels(resource).observe(time.monotonic() - started)
        held = (self._state.pod_devices.get(uid) or {}).get(container) or {}
        if held.get(resource) != assignment:
            raise DeviceError(f"the devices of container {container} changed while {resource} allocated them")
        if devices != assignment.device_ids and not set(devices) <= self._free(resource) | set(assignment.device_ids):
            raise DeviceError(f"the devices {resource} preferred were taken meanwhile; trying again")
        allocated = Assignment(devices, response.SerializeToString())
        held[resource] = allocated
        try:
            self._require_checkpoint().save(self._state)
        except OSError as exc:
            held[resource] = assignment
            raise DeviceError(f"cannot record the allocation in {self._require_checkpoint().path}: {exc}") from None
        return allocated

    async def _preferred(self, endpoint: Endpoint, uid: str, container: str, resource: str,
                         assignment: Assignment) -> tuple[str, ...]:
        """The devices to allocate once the plugin said which it prefers (the planned ones when it fails)."""
        siblings = {name: resources for name, resources in (self._state.pod_devices.get(uid) or {}).items()
                    if name != container}
        must_include = sorted(set(assignment.device_ids) & devices_in_use({uid: siblings}, resource))
        available = sorted(self._free(resource) | set(assignment.device_ids))
        try:
            preferred = await endpoint.preferred(available, must_include, len(assignment.device_ids))
        except PluginCallError as exc:
            log.warning("%s; allocating %s", exc, ",".join(assignment.device_ids))
            return assignment.device_ids
        return prefer(assignment.device_ids, preferred, available=available, must_include=must_include)

    def _free(self, resource: str) -> set[str]:
        return set(self.healthy_devices().get(resource, ())) - devices_in_use(self._state.pod_devices, resource)

    # -- pod resources --------------------------------------------------------------------------------------

    def container_devices(self, uid: str, container: str) -> dict[str, tuple[str, ...]]:
        return {resource: assignment.device_ids
                for resource, assignment in ((self._state.pod_devices.get(uid) or {}).get(container) or {}).items()}

    # -- checkpoint -----------------------------------------------------------------------------------------

    def _require_checkpoint(self) -> DeviceCheckpoint:
        if self._checkpoint is None:
            raise EdgeletError("the device manager has not started")
        return self._checkpoint

    def _save(self, what: str) -> None:
        try:
            self._require_checkpoint().save(self._state)
        except OSError as exc:
            log.warning("device manager: cannot record %s in %s: %s", what, self._require_checkpoint().path, exc)
