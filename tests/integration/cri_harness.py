"""Talking to the tests' private containerd directly, as the raw CRI client does: pod and container configs with
the kubelet's labels, a pod started by hand, what the runtime holds, and a socket proxy a test can take down."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient


def sandbox_config(containerd, *, host_network: bool = True, labels: dict[str, str] | None = None):
    name = f"pod-{uuid.uuid4().hex[:8]}"
    uid = str(uuid.uuid4())
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
        # A pod sharing the host's network shares its UTS namespace too: no hostname of its own.
        hostname="" if host_network else name,
        log_directory=str(containerd.state_dir / "pods" / f"default_{name}_{uid}"),
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid, **(labels or {})},
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE if host_network else pb.POD)
            )
        ),
    )


def container_config(containerd, name: str = "main", command=("sleep", "3600")):
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image=containerd.image),
        command=list(command),
        log_path=f"{name}/0.log",
        labels={"io.kubernetes.container.name": name},
        annotations={"io.kubernetes.container.restartCount": "0"},
    )


async def start_pod(cri, containerd, **sandbox_kwargs) -> tuple[str, str, pb.PodSandboxConfig]:
    config = sandbox_config(containerd, **sandbox_kwargs)
    sandbox_id = await cri.run_pod_sandbox(config)
    container_id = await cri.create_container(sandbox_id, container_config(containerd), config)
    await cri.start_container(container_id)
    return sandbox_id, container_id, config


async def start_labelled_pod(cri, containerd, *, annotations=None) -> tuple[str, str]:
    """A running pod of one container labelled with its pod's uid, as the agent labels them: (uid, id)."""
    config = sandbox_config(containerd)
    config.annotations.update(annotations or {})
    sandbox_id = await cri.run_pod_sandbox(config)
    container = container_config(containerd)
    container.labels["io.kubernetes.pod.uid"] = config.metadata.uid
    container_id = await cri.create_container(sandbox_id, container, config)
    await cri.start_container(container_id)
    return config.metadata.uid, container_id


def runtime_objects(endpoint: str, pod_uid: str | None = None):
    """(sandboxes, containers) as CRI lists them, optionally of one pod."""

    async def fetch():
        async with RuntimeClient(endpoint) as client:
            selector = {labels.POD_UID: pod_uid} if pod_uid else {}
            sandboxes = await client.list_pod_sandbox(pb.PodSandboxFilter(label_selector=selector))
            containers = await client.list_containers(pb.ContainerFilter(label_selector=selector))
            return sandboxes, containers

    return asyncio.run(fetch())


class SocketProxy:
    """A unix-socket proxy in front of containerd that the test can take down and bring back."""

    def __init__(self, path: str, target: str):
        self.path, self.target = path, target
        self.loop = asyncio.new_event_loop()
        self.server = None
        self.conns: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def _pipe(self, reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader, writer):
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        self.conns.update({writer, up_writer})
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def up(self):
        async def start():
            self.server = await asyncio.start_unix_server(self._handle, self.path)
        asyncio.run_coroutine_threadsafe(start(), self.loop).result()

    def down(self):
        async def stop():
            self.server.close()
            for writer in list(self.conns):
                writer.transport.abort()
            self.conns.clear()
            if os.path.exists(self.path):
                os.unlink(self.path)
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()
