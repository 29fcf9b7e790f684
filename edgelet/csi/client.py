"""gRPC clients of a plugin's sockets: its registration socket (pluginregistration v1) and the CSI Node and Identity
services of a driver. Loaded when a plugin registers; every call has a deadline and fails as CsiError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpc import aio

from . import csi_pb2 as csi
from . import pluginregistration_pb2 as reg
from .csi_pb2_grpc import IdentityStub, NodeStub
from .errors import CsiError
from .pluginregistration_pb2_grpc import RegistrationStub

CALL_TIMEOUT = 15.0  # registration and info calls
VOLUME_TIMEOUT = 120.0  # the kubelet's csiTimeout for stage/publish and their undoing
CAPABILITY_MODES = {  # PV accessModes -> the CSI access mode the kubelet asks for
    "ReadWriteOnce": csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
    "ReadWriteOncePod": csi.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER,
    "ReadOnlyMany": csi.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY,
    "ReadWriteMany": csi.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER,
}


def _target(socket_path: str) -> str:
    return socket_path if socket_path.startswith("unix:") else "unix://" + socket_path


async def _call(operation: str, method: Any, request: Any, timeout: float) -> Any:
    try:
        return await method(request, timeout=timeout)
    except aio.AioRpcError as e:
        raise CsiError(f"{operation} failed: rpc error: code = {e.code().name} desc = {e.details()}") from None


async def plugin_info(socket_path: str) -> reg.PluginInfo:
    async with aio.insecure_channel(_target(socket_path)) as channel:
        return await _call("GetInfo", RegistrationStub(channel).GetInfo, reg.InfoRequest(), CALL_TIMEOUT)


async def notify_registration(socket_path: str, registered: bool, error: str = "") -> None:
    async with aio.insecure_channel(_target(socket_path)) as channel:
        await _call("NotifyRegistrationStatus", RegistrationStub(channel).NotifyRegistrationStatus,
                    reg.RegistrationStatus(plugin_registered=registered, error=error), CALL_TIMEOUT)


def volume_capability(access_modes: list[str] | None, fs_type: str = "",
                      mount_flags: list[str] | None = None) -> csi.VolumeCapability:
    """The kubelet's capability: a mount with the PV's fsType and mountOptions; its first access mode (RWO when
    none is given, as for inline volumes)."""
    mode = CAPABILITY_MODES.get((access_modes or ["ReadWriteOnce"])[0], csi.VolumeCapability.AccessMode.UNKNOWN)
    return csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(fs_type=fs_type, mount_flags=mount_flags or []),
                                access_mode=csi.VolumeCapability.AccessMode(mode=mode))


class NodeClient:
    """One channel to a driver's CSI socket; close it when the driver goes."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._channel = aio.insecure_channel(_target(endpoint))
        self._node = NodeStub(self._channel)
        self._identity = IdentityStub(self._channel)
        self._capabilities: set[int] | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def plugin_name(self) -> str:
        reply = await _call("GetPluginInfo", self._identity.GetPluginInfo, csi.GetPluginInfoRequest(), CALL_TIMEOUT)
        return reply.name

    async def node_info(self) -> csi.NodeGetInfoResponse:
        return await _call("NodeGetInfo", self._node.NodeGetInfo, csi.NodeGetInfoRequest(), CALL_TIMEOUT)

    async def capabilities(self) -> set[int]:
        """The node service's RPC capabilities (asked once per client)."""
        if self._capabilities is None:
            reply = await _call("NodeGetCapabilities", self._node.NodeGetCapabilities,
                                csi.NodeGetCapabilitiesRequest(), CALL_TIMEOUT)
            self._capabilities = {cap.rpc.type for cap in reply.capabilities if cap.HasField("rpc")}
        return self._capabilities

    async def stages(self) -> bool:
        return csi.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME in await self.capabilities()

    async def reports_stats(self) -> bool:
        return csi.NodeServiceCapability.RPC.GET_VOLUME_STATS in await self.capabilities()

    async def stage(self, volume_id: str, staging_path: str, capability: csi.VolumeCapability, *,
                    publish_context: Mapping[str, str], volume_context: Mapping[str, str],
                    secrets: Mapping[str, str]) -> None:
        await _call("NodeStageVolume", self._node.NodeStageVolume, csi.NodeStageVolumeRequest(
            volume_id=volume_id, staging_target_path=staging_path, volume_capability=capability,
            publish_context=publish_context, volume_context=volume_context, secrets=secrets), VOLUME_TIMEOUT)

    async def unstage(self, volume_id: str, staging_path: str) -> None:
        await _call("NodeUnstageVolume", self._node.NodeUnstageVolume,
                    csi.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging_path), VOLUME_TIMEOUT)

    async def publish(self, volume_id: str, target_path: str, capability: csi.VolumeCapability, *,
                      staging_path: str, read_only: bool, publish_context: Mapping[str, str],
                      volume_context: Mapping[str, str], secrets: Mapping[str, str]) -> None:
        await _call("NodePublishVolume", self._node.NodePublishVolume, csi.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=target_path, staging_target_path=staging_path,
            volume_capability=capability, readonly=read_only, publish_context=publish_context,
            volume_context=volume_context, secrets=secrets), VOLUME_TIMEOUT)

    async def unpublish(self, volume_id: str, target_path: str) -> None:
        await _call("NodeUnpublishVolume", self._node.NodeUnpublishVolume,
                    csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path), VOLUME_TIMEOUT)

    async def volume_stats(self, volume_id: str, volume_path: str, staging_path: str = "") -> dict[str, int]:
        """{"available", "capacity", "used"} in bytes and {"inodesFree", "inodes", "inodesUsed"} as reported."""
        reply = await _call("NodeGetVolumeStats", self._node.NodeGetVolumeStats, csi.NodeGetVolumeStatsRequest(
            volume_id=volume_id, volume_path=volume_path, staging_target_path=staging_path), CALL_TIMEOUT)
        stats: dict[str, int] = {}
        for usage in reply.usage:
            if usage.unit == csi.VolumeUsage.BYTES:
                stats.update(availableBytes=usage.available, capacityBytes=usage.total, usedBytes=usage.used)
            elif usage.unit == csi.VolumeUsage.INODES:
                stats.update(inodesFree=usage.available, inodes=usage.total, inodesUsed=usage.used)
        return stats
