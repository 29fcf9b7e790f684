"""A CSI node plugin for the tests, run as its own process as a driver's DaemonSet pod would be: it registers through
a socket in the plugins_registry directory (pluginregistration v1, as node-driver-registrar does) and serves the CSI
Identity and Node services on another socket. Volumes are directories under `--base`: NodeStageVolume marks the
staging path, NodePublishVolume bind-mounts the volume's directory on the target path (read-only if asked). Every
call is appended to `--log` as one JSON line, so tests can count what the agent asked.

    python -m tests.csi_driver --name NAME --registry DIR --socket PATH --base DIR --log FILE [--node-id ID]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
from concurrent import futures

import grpc

from edgelet.csi import csi_pb2 as csi
from edgelet.csi import pluginregistration_pb2 as reg
from edgelet.csi.csi_pb2_grpc import (
    IdentityServicer,
    NodeServicer,
    add_IdentityServicer_to_server,
    add_NodeServicer_to_server,
)
from edgelet.csi.pluginregistration_pb2_grpc import RegistrationServicer, add_RegistrationServicer_to_server

TOPOLOGY_KEY = "topology.test.csi/zone"
STAGED_MARK = ".staged"


class Recorder:
    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def __call__(self, method: str, **fields) -> None:
        with self.lock, open(self.path, "a") as stream:
            stream.write(json.dumps({"method": method, **fields}) + "\n")


def read_calls(path) -> list[dict]:
    try:
        with open(path) as stream:
            return [json.loads(line) for line in stream if line.strip()]
    except FileNotFoundError:
        return []


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as stream:
        return any(line.split()[4] == path for line in stream)


class Plugin(IdentityServicer, NodeServicer, RegistrationServicer):
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.record = Recorder(args.log)

    # -- registration (the registrar's side) --

    def GetInfo(self, request, context):
        self.record("GetInfo")
        return reg.PluginInfo(type="CSIPlugin", name=self.args.name, endpoint=self.args.socket,
                              supported_versions=["1.0.0"])

    def NotifyRegistrationStatus(self, request, context):
        self.record("NotifyRegistrationStatus", registered=request.plugin_registered, error=request.error)
        return reg.RegistrationStatusResponse()

    # -- identity --

    def GetPluginInfo(self, request, context):
        return csi.GetPluginInfoResponse(name=self.args.name, vendor_version="0.1")

    def GetPluginCapabilities(self, request, context):
        return csi.GetPluginCapabilitiesResponse()

    def Probe(self, request, context):
        return csi.ProbeResponse()

    # -- node --

    def NodeGetInfo(self, request, context):
        self.record("NodeGetInfo")
        return csi.NodeGetInfoResponse(node_id=self.args.node_id, max_volumes_per_node=8,
                                       accessible_topology=csi.Topology(segments={TOPOLOGY_KEY: "z1"}))

    def NodeGetCapabilities(self, request, context):
        rpc = csi.NodeServiceCapability.RPC
        return csi.NodeGetCapabilitiesResponse(capabilities=[
            csi.NodeServiceCapability(rpc=rpc(type=rpc.STAGE_UNSTAGE_VOLUME)),
            csi.NodeServiceCapability(rpc=rpc(type=rpc.GET_VOLUME_STATS))])

    def NodeStageVolume(self, request, context):
        self.record("NodeStageVolume", volume_id=request.volume_id, staging=request.staging_target_path,
                    context=dict(request.volume_context), publish_context=dict(request.publish_context),
                    secrets=sorted(request.secrets))
        os.makedirs(os.path.join(self.args.base, request.volume_id), exist_ok=True)
        with open(os.path.join(request.staging_target_path, STAGED_MARK), "w") as stream:
            stream.write(request.volume_id)
        return csi.NodeStageVolumeResponse()

    def NodeUnstageVolume(self, request, context):
        self.record("NodeUnstageVolume", volume_id=request.volume_id, staging=request.staging_target_path)
        try:
            os.unlink(os.path.join(request.staging_target_path, STAGED_MARK))
        except FileNotFoundError:
            pass
        return csi.NodeUnstageVolumeResponse()

    def NodePublishVolume(self, request, context):
        self.record("NodePublishVolume", volume_id=request.volume_id, target=request.target_path,
                    staging=request.staging_target_path, readonly=request.readonly,
                    context=dict(request.volume_context))
        if request.staging_target_path and not os.path.exists(os.path.join(request.staging_target_path, STAGED_MARK)):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "volume is not staged")
        source = os.path.join(self.args.base, request.volume_id)
        os.makedirs(source, exist_ok=True)
        os.makedirs(request.target_path, exist_ok=True)
        if not _mounted(request.target_path):
            subprocess.run(["mount", "--bind", source, request.target_path], check=True)
            if request.readonly:
                subprocess.run(["mount", "-o", "remount,bind,ro", request.target_path], check=True)
        return csi.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        self.record("NodeUnpublishVolume", volume_id=request.volume_id, target=request.target_path)
        if _mounted(request.target_path):
            subprocess.run(["umount", request.target_path], check=True)
        try:
            os.rmdir(request.target_path)
        except FileNotFoundError:
            pass
        return csi.NodeUnpublishVolumeResponse()

    def NodeGetVolumeStats(self, request, context):
        self.record("NodeGetVolumeStats", volume_id=request.volume_id, path=request.volume_path)
        vfs = os.statvfs(request.volume_path)
        used = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(request.volume_path) for f in files)
        return csi.NodeGetVolumeStatsResponse(usage=[
            csi.VolumeUsage(unit=csi.VolumeUsage.BYTES, total=vfs.f_blocks * vfs.f_frsize,
                            available=vfs.f_bavail * vfs.f_frsize, used=used)])


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--name", "--registry", "--socket", "--base", "--log"):
        parser.add_argument(option, required=True)
    parser.add_argument("--node-id", default="test-node-id")
    args = parser.parse_args()
    plugin = Plugin(args)
    registration_socket = os.path.join(args.registry, f"{args.name}-reg.sock")
    for path in (registration_socket, args.socket):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
    driver = grpc.server(futures.ThreadPoolExecutor(4))
    add_IdentityServicer_to_server(plugin, driver)
    add_NodeServicer_to_server(plugin, driver)
    driver.add_insecure_port("unix://" + args.socket)
    driver.start()
    registrar = grpc.server(futures.ThreadPoolExecutor(2))
    add_RegistrationServicer_to_server(plugin, registrar)
    registrar.add_insecure_port("unix://" + registration_socket)
    registrar.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    registrar.stop(0)  # the registration socket goes first: the agent deregisters the driver
    if os.path.exists(registration_socket):
        os.unlink(registration_socket)
    driver.stop(0)


if __name__ == "__main__":
    main()
