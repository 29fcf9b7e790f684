"""A device plugin written against the kubelet's v1beta1 API as real plugins are (the generic-device-plugin's
shape): it serves DevicePlugin on its own socket in the plugin directory, registers on kubelet.sock, streams its
devices and their health, and registers again whenever kubelet.sock is made anew (a restarted node agent).

Its devices are character devices (the host's /dev/null under another name) and a file mounted per device, so a
container can show it got exactly what Allocate said."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2 as api
from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2_grpc as api_grpc

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class TestDevicePlugin(api_grpc.DevicePluginServicer):
    __test__ = False  # not a pytest class

    def __init__(self, plugin_dir: Path, resource: str, devices: list[str], *, endpoint: str = "",
                 host_files: Path | None = None,
                 preferred: Callable[[list[str], list[str], int], list[str]] | None = None,
                 pre_start_required: bool = False, version: str = "v1beta1", cdi: bool = False):
        self.plugin_dir = Path(plugin_dir)
        self.resource = resource
        self.endpoint = endpoint or resource.rpartition("/")[2] + ".sock"  # short: a socket path has 107 bytes
        self.health = {device: HEALTHY for device in devices}
        self.host_files = host_files
        self._preferred = preferred
        self.options = api.DevicePluginOptions(pre_start_required=pre_start_required,
                                               get_preferred_allocation_available=preferred is not None)
        self.version = version
        self.cdi = cdi  # answer with CDI device names (<resource>=<device>) as well
        self.calls: list[tuple[str, tuple]] = []
        self.registrations = 0
        self._changed = threading.Condition()
        self._generation = 0
        self._server: grpc.Server | None = None
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()
        if host_files is not None:
            host_files.mkdir(parents=True, exist_ok=True)
            for device in devices:
                (host_files / device).write_text(f"{device}\n")

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

    # -- the plugin's service --------------------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request, context):
        self.calls.append(("GetDevicePluginOptions", ()))
        return self.options

    def ListAndWatch(self, request, context):
        self.calls.append(("ListAndWatch", ()))
        seen = -1
        while context.is_active() and not self._stopping.is_set():
            with self._changed:
                if seen == self._generation:
                    self._changed.wait(0.2)
                    continue
                seen = self._generation
                devices = [api.Device(ID=device, health=health) for device, health in sorted(self.health.items())]
            yield api.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request, context):
        answer = api.PreferredAllocationResponse()
        for part in request.container_requests:
            self.calls.append(("GetPreferredAllocation", (list(part.available_deviceIDs),
                                                          list(part.must_include_deviceIDs), part.allocation_size)))
            chosen = self._preferred(list(part.available_deviceIDs), list(part.must_include_deviceIDs),
                                     part.allocation_size)
            answer.container_responses.add(deviceIDs=chosen)
        return answer

    def Allocate(self, request, context):
        answer = api.AllocateResponse()
        for part in request.container_requests:
            ids = list(part.devices_ids)
            self.calls.append(("Allocate", (ids,)))
            unknown = [device for device in ids if device not in self.health]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            one = answer.container_responses.add()
            one.envs["TEST_DEVICES"] = ",".join(ids)
            one.annotations["example.com/devices"] = ",".join(ids)
            for device in ids:
                if self.cdi:
                    one.cdi_devices.add(name=f"{self.resource}={device}")
                one.devices.add(container_path=f"/dev/{device}", host_path="/dev/null", permissions="rw")
                if self.host_files is not None:
                    one.mounts.add(container_path=f"/run/devices/{device}", host_path=str(self.host_files / device),
                                   read_only=True)
        return answer

    def PreStartContainer(self, request, context):
        self.calls.append(("PreStartContainer", (list(request.devices_ids),)))
        return api.PreStartContainerResponse()

    # -- driving it ------------------------------------------------------------------------------------------------

    def serve(self) -> TestDevicePlugin:
        self.socket_path.unlink(missing_ok=True)
        self._stopping.clear()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()
        return self

    def register(self, *, timeout: float = 10.0) -> None:
        """Registers on kubelet.sock; raises grpc.RpcError when refused."""
        with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            api_grpc.RegistrationStub(channel).Register(api.RegisterRequest(
                version=self.version, endpoint=self.endpoint, resource_name=self.resource, options=self.options),
                timeout=timeout, wait_for_ready=True)
        self.registrations += 1

    def start(self) -> TestDevicePlugin:
        """Serves, registers, and registers again each time kubelet.sock is made anew, as real plugins do."""
        self.serve()
        self.register()
        self._watcher = threading.Thread(target=self._watch_kubelet_socket, daemon=True)
        self._watcher.start()
        return self

    def _watch_kubelet_socket(self) -> None:
        kubelet_socket = self.plugin_dir / "kubelet.sock"
        known = _inode(kubelet_socket)
        while not self._stopping.wait(0.1):
            now = _inode(kubelet_socket)
            if now is not None and now != known:
                try:
                    if not self.socket_path.exists():  # the agent removes stale sockets: serve anew, as plugins do
                        self._server.stop(0)
                        self.serve()
                    self.register(timeout=5)
                    known = now
                except grpc.RpcError:
                    time.sleep(0.2)

    def set_health(self, device: str, health: str) -> None:
        with self._changed:
            self.health[device] = health
            self._generation += 1
            self._changed.notify_all()

    def stop(self) -> None:
        """The plugin process ends: its stream and socket go."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
        if self._server is not None:
            self._server.stop(0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)


def _inode(path: Path) -> int | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino ^ stat.st_ctime_ns
