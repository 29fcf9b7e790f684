"""Async CRI v1 client over a unix socket: every call is timed and counted once, and gRPC failures become edgelet
errors.

This is edgelet's counterpart of the kubelet's instrumented remote runtime. The relist hot path gets
`list_pod_sandbox_raw()` / `list_containers_raw()`, which hand back the undecoded reply bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc import aio

from edgelet.cri import CRIError, NotFound, RuntimeCallError, RuntimeTimeout, RuntimeUnavailable
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.metrics import registry as metrics

CRI_API_VERSION = "v1"

# A ListContainers reply for 10,000 containers with kubelet labels is ~10 MB; leave room.
MAX_RECEIVE_MESSAGE_BYTES = 64 * 1024 * 1024

# The runtime is local: reconnect quickly after it restarts instead of gRPC's default two minutes.
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 3000),
)

_UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_RUNTIME = "/runtime.v1.RuntimeService/"
_IMAGE = "/runtime.v1.ImageService/"

# operation label (as the kubelet names it) -> (method path, request type, response type)
_RPCS: dict[str, tuple[str, Any, Any]] = {
    "version": (_RUNTIME + "Version", pb.VersionRequest, pb.VersionResponse),
    "status": (_RUNTIME + "Status", pb.StatusRequest, pb.StatusResponse),
    "run_podsandbox": (_RUNTIME + "RunPodSandbox", pb.RunPodSandboxRequest, pb.RunPodSandboxResponse),
    "stop_podsandbox": (_RUNTIME + "StopPodSandbox", pb.StopPodSandboxRequest, pb.StopPodSandboxResponse),
    "remove_podsandbox": (_RUNTIME + "RemovePodSandbox", pb.RemovePodSandboxRequest, pb.RemovePodSandboxResponse),
    "podsandbox_status": (_RUNTIME + "PodSandboxStatus", pb.PodSandboxStatusRequest, pb.PodSandboxStatusResponse),
    "list_podsandbox": (_RUNTIME + "ListPodSandbox", pb.ListPodSandboxRequest, pb.ListPodSandboxResponse),
    "create_container": (_RUNTIME + "CreateContainer", pb.CreateContainerRequest, pb.CreateContainerResponse),
    "start_container": (_RUNTIME + "StartContainer", pb.StartContainerRequest, pb.StartContainerResponse),
    "stop_container": (_RUNTIME + "StopContainer", pb.StopContainerRequest, pb.StopContainerResponse),
    "remove_container": (_RUNTIME + "RemoveContainer", pb.RemoveContainerRequest, pb.RemoveContainerResponse),
    "list_containers": (_RUNTIME + "ListContainers", pb.ListContainersRequest, pb.ListContainersResponse),
    "container_status": (_RUNTIME + "ContainerStatus", pb.ContainerStatusRequest, pb.ContainerStatusResponse),
    "update_container": (
        _RUNTIME + "UpdateContainerResources",
        pb.UpdateContainerResourcesRequest,
        pb.UpdateContainerResourcesResponse,
    ),
    "reopen_container_log": (
        _RUNTIME + "ReopenContainerLog",
        pb.ReopenContainerLogRequest,
        pb.ReopenContainerLogResponse,
    ),
    "exec_sync": (_RUNTIME + "ExecSync", pb.ExecSyncRequest, pb.ExecSyncResponse),
    "exec": (_RUNTIME + "Exec", pb.ExecRequest, pb.ExecResponse),
    "attach": (_RUNTIME + "Attach", pb.AttachRequest, pb.AttachResponse),
    "port_forward": (_RUNTIME + "PortForward", pb.PortForwardRequest, pb.PortForwardResponse),
    "list_container_stats": (
        _RUNTIME + "ListContainerStats",
        pb.ListContainerStatsRequest,
        pb.ListContainerStatsResponse,
    ),
    "list_podsandbox_stats": (
        _RUNTIME + "ListPodSandboxStats",
        pb.ListPodSandboxStatsRequest,
        pb.ListPodSandboxStatsResponse,
    ),
    "list_images": (_IMAGE + "ListImages", pb.ListImagesRequest, pb.ListImagesResponse),
    "image_status": (_IMAGE + "ImageStatus", pb.ImageStatusRequest, pb.ImageStatusResponse),
    "pull_image": (_IMAGE + "PullImage", pb.PullImageRequest, pb.PullImageResponse),
    "remove_image": (_IMAGE + "RemoveImage", pb.RemoveImageRequest, pb.RemoveImageResponse),
    "image_fs_info": (_IMAGE + "ImageFsInfo", pb.ImageFsInfoRequest, pb.ImageFsInfoResponse),
    "runtime_config": (_RUNTIME + "RuntimeConfig", pb.RuntimeConfigRequest, pb.RuntimeConfigResponse),
    "update_runtime_config": (
        _RUNTIME + "UpdateRuntimeConfig",
        pb.UpdateRuntimeConfigRequest,
        pb.UpdateRuntimeConfigResponse,
    ),
}

# The container event stream (the evented PLEG): opened once, read for as long as it lasts.
_CONTAINER_EVENTS = _RUNTIME + "GetContainerEvents"

# Stands for "the client's timeout" where None already means "no deadline".
_CLIENT_TIMEOUT: Any = object()

# Calls whose reply the relist reads as bytes (see edgelet/_core); same RPC, no decoding here.
_RAW_RPCS = ("list_podsandbox", "list_containers")

# Calls the runtime sees through to their end even when their caller is cancelled (a pod worker stopped, the
# agent shutting down) or stops waiting for the reply (the client's timeout). A cancelled call cancels its
# request's context in the runtime, and containerd 2.x, cancelled while it makes a task, can keep a task it has
# made but not started: the container is then reported exited, cannot be stopped, and cannot be removed until
# containerd restarts ("cannot delete running task"; containerd issue 11037). Seen here with a crash-looping
# container whose restart an agent stop cut short. A deadline that reached the runtime would cancel the same way
# on a busy machine, half-way through a create or a start. So the caller stops waiting (RuntimeTimeout after the
# client's timeout), the call runs on with a deadline of RUN_ON_FACTOR timeouts, and close() lets it end before
# closing the channel; what it did shows in the next relist.
_RUN_TO_END = frozenset({"run_podsandbox", "create_container", "start_container"})
RUN_ON_FACTOR = 10

# The kubelet gives RunPodSandbox twice the runtime request timeout (4 min by default).
_DOUBLE_TIMEOUT = frozenset({"run_podsandbox"})

# How long close() waits for such calls.
CLOSE_GRACE = 10.0

log = logging.getLogger(__name__)


def _abandoned(call: asyncio.Future) -> None:
    """The end of a call its caller stopped waiting for: a failure is logged here, as nobody else will see it (the
    next sync sees the state it left)."""
    if not call.cancelled() and (error := call.exception()) is not None:
        log.info("a runtime call that ran on after its caller stopped waiting failed: %s", error)


def normalize_endpoint(endpoint: str) -> str:
    """`unix:///path` or a bare absolute socket path -> the gRPC target `unix:///path`."""
    if endpoint.startswith("/"):
        return "unix://" + endpoint
    if endpoint.startswith("unix://") and len(endpoint) > len("unix://"):
        return endpoint
    raise ValueError(f"runtime endpoint {endpoint!r}: want unix:///path/to/socket")


def translate_error(endpoint: str, operation: str, code: grpc.StatusCode, details: str | None) -> RuntimeCallError:
    """Maps a gRPC status to the edgelet error a caller should handle (pure; table-tested)."""
    details = details or ""
    if code in _UNAVAILABLE_CODES:
        return RuntimeUnavailable(endpoint, operation, code.name, details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(operation, code.name, details)
    return CRIError(operation, code.name, details)


class RuntimeClient:
    """One gRPC channel to a CRI runtime (RuntimeService and ImageService on the same socket).

    Every method raises RuntimeUnavailable, NotFound or CRIError (edgelet.cri) on failure. Stop and
    remove calls treat "not found" as done, like the kubelet, so deletes are idempotent. Use one client
    from one event loop: its channel opens on the first call, bound to the loop that makes it.
    """

    def __init__(self, endpoint: str, *, timeout: float = 120.0):
        self.endpoint = normalize_endpoint(endpoint)
        self.timeout = timeout
        # grpc.aio binds a channel to the running loop, so the channel waits for the first call.
        self._channel: aio.Channel | None = None
        self._calls: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._raw_calls: dict[str, Callable[..., Awaitable[bytes]]] = {}
        self._running_to_end: set[asyncio.Future] = set()
        # Resolve the metric children once: .labels() takes a lock and a dict lookup per call.
        self._observe = {op: metrics.runtime_operations_duration_seconds.labels(op).observe for op in _RPCS}
        self._count_error = {op: metrics.runtime_operations_errors.labels(op).inc for op in _RPCS}

    def connect(self) -> None:
        """Opens the channel and starts connecting in the background (call it from the loop that will use
        the client), so that the first call does not wait for the connection; calls need not wait for it."""
        channel = self._channel if self._channel is not None else self._connect()
        channel.get_state(try_to_connect=True)

    def _connect(self) -> aio.Channel:
        channel = aio.insecure_channel(self.endpoint, options=_CHANNEL_OPTIONS)
        for operation, (path, request_type, response_type) in _RPCS.items():
            self._calls[operation] = channel.unary_unary(
                path,
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
            if operation in _RAW_RPCS:
                # No deserializer: gRPC returns the reply as the bytes that came off the wire.
                self._raw_calls[operation] = channel.unary_unary(
                    path, request_serializer=request_type.SerializeToString, response_deserializer=None
                )
        self._channel = channel
        return channel

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Closes the channel once the calls that run to their end have ended (at most `grace` seconds)."""
        if self._running_to_end:
            await asyncio.wait(list(self._running_to_end), timeout=grace)
        if self._channel is not None:
            channel, self._channel = self._channel, None
            self._calls.clear()
            self._raw_calls.clear()
            await channel.close()

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _invoke(
        self, operation: str, request: Any, *, timeout: float | None = _CLIENT_TIMEOUT, raw: bool = False
    ) -> Any:
        """The one place every call passes: deadline, duration histogram, error counter, error mapping."""
        if operation not in _RUN_TO_END:
            return await self._call(operation, request, timeout, raw)
        wait = self.timeout if timeout is _CLIENT_TIMEOUT else timeout
        if wait is not None and operation in _DOUBLE_TIMEOUT:
            wait *= 2
        call = asyncio.ensure_future(
            self._call(operation, request, wait * RUN_ON_FACTOR if wait is not None else None, raw))
        self._running_to_end.add(call)
        call.add_done_callback(self._running_to_end.discard)
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(_abandoned)
            raise
        except TimeoutError:
            call.add_done_callback(_abandoned)
            self._count_error[operation]()
            if wait is None:  # not this deadline's (asyncio.timeout(None) never expires)
                raise
            raise RuntimeTimeout(self.endpoint, operation, wait) from None

    async def _call(self, operation: str, request: Any, timeout: float | None, raw: bool) -> Any:
        if self._channel is None:
            self._connect()
        call = self._raw_calls[operation] if raw else self._calls[operation]
        deadline = self.timeout if timeout is _CLIENT_TIMEOUT else timeout
        started = time.perf_counter()
        try:
            return await call(request, timeout=deadline)
        except aio.AioRpcError as err:
            self._count_error[operation]()
            raise translate_error(self.endpoint, operation, err.code(), err.details()) from None
        finally:
            self._observe[operation](time.perf_counter() - started)

    async def _invoke_idempotent(
        self, operation: str, request: Any, *, timeout: float | None = _CLIENT_TIMEOUT
    ) -> None:
        try:
            await self._invoke(operation, request, timeout=timeout)
        except NotFound:
            pass

    # -- runtime ------------------------------------------------------------------------------

    async def version(self) -> pb.VersionResponse:
        return await self._invoke("version", pb.VersionRequest(version=CRI_API_VERSION))

    async def status(self, *, verbose: bool = False) -> pb.StatusResponse:
        return await self._invoke("status", pb.StatusRequest(verbose=verbose))

    async def runtime_config(self) -> pb.RuntimeConfigResponse:
        """The runtime's own configuration (its cgroup driver); CRIError code UNIMPLEMENTED before containerd 2.0."""
        return await self._invoke("runtime_config", pb.RuntimeConfigRequest())

    async def update_pod_cidr(self, pod_cidr: str) -> None:
        """Hands the node's pod CIDR (spec.podCIDR; several joined by commas) to the runtime's network plugin."""
        config = pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=pod_cidr))
        await self._invoke("update_runtime_config", pb.UpdateRuntimeConfigRequest(runtime_config=config))

    async def container_events(self) -> AsyncIterator[bytes]:
        """The runtime's container events as serialized ContainerEventResponse messages, until the stream ends.

        Raises RuntimeUnavailable when the runtime goes away, CRIError code UNIMPLEMENTED when it serves no
        events (containerd before 1.7). The stream has no deadline; a normal end returns.
        """
        channel = self._channel if self._channel is not None else self._connect()
        # Raw: the PLEG only needs to know that something changed, and relists to learn what.
        events: Callable[..., Any] = channel.unary_stream(
            _CONTAINER_EVENTS, request_serializer=pb.GetEventsRequest.SerializeToString, response_deserializer=None)
        call = events(pb.GetEventsRequest())
        try:
            async for message in call:
                yield message
        except aio.AioRpcError as err:
            raise translate_error(self.endpoint, "get_container_events", err.code(), err.details()) from None
        finally:
            call.cancel()

    # -- sandboxes ----------------------------------------------------------------------------

    async def run_pod_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str = "") -> str:
        request = pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        return (await self._invoke("run_podsandbox", request)).pod_sandbox_id

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._invoke_idempotent("stop_podsandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._invoke_idempotent("remove_podsandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))

    async def pod_sandbox_status(self, sandbox_id: str, *, verbose: bool = False) -> pb.PodSandboxStatusResponse:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose)
        return await self._invoke("podsandbox_status", request)

    async def list_pod_sandbox(self, filter: pb.PodSandboxFilter | None = None) -> list[pb.PodSandbox]:
        return list((await self._invoke("list_podsandbox", pb.ListPodSandboxRequest(filter=filter))).items)

    async def list_pod_sandbox_raw(self, filter: pb.PodSandboxFilter | None = None) -> bytes:
        """The serialized ListPodSandboxResponse, untouched."""
        return await self._invoke("list_podsandbox", pb.ListPodSandboxRequest(filter=filter), raw=True)

    # -- containers ---------------------------------------------------------------------------

    async def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig
    ) -> str:
        request = pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config)
        return (await self._invoke("create_container", request)).container_id

    async def start_container(self, container_id: str) -> None:
        await self._invoke("start_container", pb.StartContainerRequest(container_id=container_id))

    async def stop_container(self, container_id: str, timeout_s: int) -> None:
        """Asks the runtime to stop within `timeout_s` seconds (then it kills); our deadline adds the call timeout."""
        request = pb.StopContainerRequest(container_id=container_id, timeout=timeout_s)
        await self._invoke_idempotent("stop_container", request, timeout=self.timeout + max(timeout_s, 0))

    async def remove_container(self, container_id: str) -> None:
        await self._invoke_idempotent("remove_container", pb.RemoveContainerRequest(container_id=container_id))

    async def list_containers(self, filter: pb.ContainerFilter | None = None) -> list[pb.Container]:
        return list((await self._invoke("list_containers", pb.ListContainersRequest(filter=filter))).containers)

    async def list_containers_raw(self, filter: pb.ContainerFilter | None = None) -> bytes:
        """The serialized ListContainersResponse, untouched."""
        return await self._invoke("list_containers", pb.ListContainersRequest(filter=filter), raw=True)

    async def container_status(self, container_id: str) -> pb.ContainerStatus:
        request = pb.ContainerStatusRequest(container_id=container_id)
        return (await self._invoke("container_status", request)).status

    async def update_container_resources(self, container_id: str, linux: pb.LinuxContainerResources) -> None:
        request = pb.UpdateContainerResourcesRequest(container_id=container_id, linux=linux)
        await self._invoke("update_container", request)

    async def reopen_container_log(self, container_id: str) -> None:
        await self._invoke("reopen_container_log", pb.ReopenContainerLogRequest(container_id=container_id))

    async def exec_sync(self, container_id: str, cmd: Sequence[str], timeout_s: int) -> tuple[int, bytes, bytes]:
        """Runs `cmd` in the container; `timeout_s` 0 lets it run unbounded, as the CRI defines."""
        request = pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout_s)
        deadline = self.timeout + timeout_s if timeout_s > 0 else None
        reply = await self._invoke("exec_sync", request, timeout=deadline)
        return reply.exit_code, reply.stdout, reply.stderr

    # -- streaming and stats ------------------------------------------------------------------

    async def exec(self, request: pb.ExecRequest) -> str:
        """The streaming-server URL to upgrade on for one exec session."""
        return (await self._invoke("exec", request)).url

    async def attach(self, request: pb.AttachRequest) -> str:
        return (await self._invoke("attach", request)).url

    async def port_forward(self, sandbox_id: str, ports: Sequence[int] = ()) -> str:
        request = pb.PortForwardRequest(pod_sandbox_id=sandbox_id, port=list(ports))
        return (await self._invoke("port_forward", request)).url

    async def list_container_stats(self, filter: pb.ContainerStatsFilter | None = None) -> list[pb.ContainerStats]:
        request = pb.ListContainerStatsRequest(filter=filter)
        return list((await self._invoke("list_container_stats", request)).stats)

    async def list_pod_sandbox_stats(self, filter: pb.PodSandboxStatsFilter | None = None) -> list[pb.PodSandboxStats]:
        request = pb.ListPodSandboxStatsRequest(filter=filter)
        return list((await self._invoke("list_podsandbox_stats", request)).stats)

    # -- images -------------------------------------------------------------------------------

    async def list_images(self, filter: pb.ImageFilter | None = None) -> list[pb.Image]:
        return list((await self._invoke("list_images", pb.ListImagesRequest(filter=filter))).images)

    async def image_status(self, image: str) -> pb.Image | None:
        """The image as the runtime knows it, or None when it does not have it."""
        reply = await self._invoke("image_status", pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))
        return reply.image if reply.HasField("image") and reply.image.id else None

    async def pull_image(
        self,
        image: str,
        auth: pb.AuthConfig | None = None,
        sandbox_config: pb.PodSandboxConfig | None = None,
    ) -> str:
        """Pulls `image` and returns the runtime's reference to it (an image id or digest).

        No deadline, as the kubelet sets none: a pull on a slow link may take hours and still be healthy. A pull
        that stops moving is the runtime's to cancel (containerd's image_pull_progress_timeout), or the caller's
        (edgelet.images.progress); cancelling this call cancels the pull in the runtime.
        """
        request = pb.PullImageRequest(image=pb.ImageSpec(image=image), auth=auth, sandbox_config=sandbox_config)
        return (await self._invoke("pull_image", request, timeout=None)).image_ref

    async def remove_image(self, image: str) -> None:
        await self._invoke_idempotent("remove_image", pb.RemoveImageRequest(image=pb.ImageSpec(image=image)))

    async def image_fs_info(self) -> pb.ImageFsInfoResponse:
        return await self._invoke("image_fs_info", pb.ImageFsInfoRequest())
