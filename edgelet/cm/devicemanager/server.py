"""The node agent's gRPC sockets for devices, served by one gRPC server: device plugins register on
`<plugin dir>/kubelet.sock` (v1beta1.Registration), monitoring agents read the pod resources API on its own socket.
It binds with the agent's other listeners, before anything starts."""

from __future__ import annotations

import logging
import os
import stat

import grpc
from grpc import aio

from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2 as api
from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2_grpc as api_grpc
from edgelet.cm.devicemanager.manager import DeviceManager, RegistrationError
from edgelet.server.http import ListenAddress, ListenError

log = logging.getLogger(__name__)


class RegistrationServer(api_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager):
        self._manager = manager

    async def Register(self, request, context):
        try:
            self._manager.register(request)
        except RegistrationError as exc:
            log.warning("device manager: registration of %r from %r refused: %s", request.resource_name,
                        request.endpoint, exc)
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        return api.Empty()


class DeviceServer:
    """A listener (edgelet.server.Listener) on the registration socket and, when `pod_resources_socket` is set,
    the pod resources socket; `add_pod_resources(server)` adds that service."""

    def __init__(self, manager: DeviceManager, *, pod_resources_socket: str = "", add_pod_resources=None):
        self._manager = manager
        self._pod_resources_socket = pod_resources_socket
        self._add_pod_resources = add_pod_resources
        self.address = ListenAddress(unix_path=manager.socket_path)
        self._server: aio.Server | None = None

    def _paths(self) -> list[str]:
        return [self._manager.socket_path, *([self._pod_resources_socket] if self._pod_resources_socket else [])]

    async def start(self) -> None:
        server = aio.server()
        api_grpc.add_RegistrationServicer_to_server(RegistrationServer(self._manager), server)
        if self._pod_resources_socket and self._add_pod_resources is not None:
            self._add_pod_resources(server)
        for path in self._paths():
            try:
                os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
                _remove_socket(path)
            except OSError as exc:
                raise ListenError(f"cannot listen on unix:{path}: {exc.strerror or exc}") from None
            try:
                server.add_insecure_port(f"unix://{path}")
            except RuntimeError as exc:
                raise ListenError(f"cannot listen on unix:{path}: {exc}") from None
        await server.start()
        self._server = server
        log.info("device manager: plugins register on %s%s", self._manager.socket_path,
                 f"; pod resources on {self._pod_resources_socket}" if self._pod_resources_socket else "")

    async def run(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        try:
            await self._server.wait_for_termination()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None


def _remove_socket(path: str) -> None:
    """A socket left by an earlier agent goes; anything else at the path is an error for the caller to report."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    os.unlink(path)
