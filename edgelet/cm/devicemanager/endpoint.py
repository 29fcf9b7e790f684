"""One registered device plugin, reached over its unix socket in the plugin directory (the kubelet's endpoint.go):
its options, its ListAndWatch stream of devices, and the calls made for containers (GetPreferredAllocation,
Allocate, PreStartContainer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc import aio

from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2 as api
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
SUPPORTED_VERSIONS = (API_VERSION,)
# How long a call to a plugin may take: the kubelet gives its Allocate and PreStartContainer 30 s.
CALL_TIMEOUT = 30.0
# A plugin that registered must answer on its socket within this time (the kubelet dials with a 10 s timeout).
DIAL_TIMEOUT = 10.0

_SERVICE = "/v1beta1.DevicePlugin/"


class PluginCallError(EdgeletError):
    """A call to a device plugin failed (the message names the resource and the call)."""


class Endpoint:
    """The client side of one plugin; `on_devices(devices)` gets each list ListAndWatch sends."""

    def __init__(self, resource: str, socket_path: str, options: api.DevicePluginOptions):
        self.resource = resource
        self.socket_path = socket_path
        self.options = options
        self._channel = aio.insecure_channel(f"unix://{socket_path}")
        self._calls: dict[str, Any] = {
            "GetDevicePluginOptions": self._channel.unary_unary(
                _SERVICE + "GetDevicePluginOptions", request_serializer=api.Empty.SerializeToString,
                response_deserializer=api.DevicePluginOptions.FromString),
            "GetPreferredAllocation": self._channel.unary_unary(
                _SERVICE + "GetPreferredAllocation",
                request_serializer=api.PreferredAllocationRequest.SerializeToString,
                response_deserializer=api.PreferredAllocationResponse.FromString),
            "Allocate": self._channel.unary_unary(
                _SERVICE + "Allocate", request_serializer=api.AllocateRequest.SerializeToString,
                response_deserializer=api.AllocateResponse.FromString),
            "PreStartContainer": self._channel.unary_unary(
                _SERVICE + "PreStartContainer", request_serializer=api.PreStartContainerRequest.SerializeToString,
                response_deserializer=api.PreStartContainerResponse.FromString),
        }
        self._list_and_watch = self._channel.unary_stream(
            _SERVICE + "ListAndWatch", request_serializer=api.Empty.SerializeToString,
            response_deserializer=api.ListAndWatchResponse.FromString)

    async def connect(self) -> None:
        """Waits until the plugin's socket answers, then asks its options (the registration's are kept when the
        plugin does not answer GetDevicePluginOptions)."""
        try:
            await aio_wait_ready(self._channel, DIAL_TIMEOUT)
        except TimeoutError:
            raise PluginCallError(f"device plugin {self.resource}: no answer on {self.socket_path} within "
                                  f"{DIAL_TIMEOUT:.0f}s") from None
        try:
            self.options = await self._calls["GetDevicePluginOptions"](api.Empty(), timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            log.info("device plugin %s: GetDevicePluginOptions failed (%s); using the options it registered with",
                     self.resource, _describe(exc))

    async def list_and_watch(self, on_devices: Callable[[Sequence[api.Device]], None]) -> str:
        """Follows the device stream until it ends; returns why it ended."""
        call = self._list_and_watch(api.Empty())
        try:
            async for response in call:
                on_devices(response.devices)
        except grpc.RpcError as exc:
            return _describe(exc)
        finally:
            call.cancel()
        return "the plugin ended its ListAndWatch stream"

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        request = api.PreferredAllocationRequest(container_requests=[api.ContainerPreferredAllocationRequest(
            available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size)])
        response = await self._call("GetPreferredAllocation", request)
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    async def allocate(self, device_ids: Sequence[str]) -> api.ContainerAllocateResponse:
        request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=list(device_ids))])
        response = await self._call("Allocate", request)
        if not response.container_responses:
            raise PluginCallError(f"device plugin {self.resource}: no containers return in allocation response")
        return response.container_responses[0]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        await self._call("PreStartContainer", api.PreStartContainerRequest(devices_ids=list(device_ids)))

    async def _call(self, name: str, request):
        try:
            return await self._calls[name](request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            raise PluginCallError(f"device plugin {self.resource}: {name} failed: {_describe(exc)}") from None

    async def close(self) -> None:
        await self._channel.close()


async def aio_wait_ready(channel: aio.Channel, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        await channel.channel_ready()


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {details}"
