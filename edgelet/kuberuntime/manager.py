"""Carries out a pod's sync over CRI: the kubelet's SyncPod, KillPod and sandbox clean-up, in numbered steps.

The decision is `compute_pod_actions` (pure); this module only executes it and reports what a user
must see (waiting reasons such as CrashLoopBackOff or ErrImagePull) back to the status manager.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState
from edgelet.kuberuntime.loglinks import link_name, make_link
from edgelet.metrics import registry as metrics
from edgelet.util.backoff import Backoff
from edgelet.util.errors import EdgeletError

from ..cri import CRIError, NotFound, RuntimeTimeout, create_in_flight, in_starting_state, start_in_flight
from ..cri import runtime_v1_pb2 as pb
from ..cri.client import RuntimeClient
from ..events import NO_EVENTS, NORMAL, WARNING, Recorder, pod_ref
from .actions import PodActions, compute_pod_actions, kill_grace_seconds, next_restart_count
from .container import add_device_options, make_container_config
from .sandbox import make_sandbox_config, pod_log_dir
from .security import SecuritySettings, needs_image_user, run_as_non_root_error
from .startgate import StartGate
from .startlog import StartLog
from .termination import TerminationOrdering

if TYPE_CHECKING:  # the collaborators, for their types only
    from edgelet.api.objectstore import ObjectStore

    from ..images.manager import ImageManager
    from ..volumes import VolumeManager
    from .resizer import Resizer

log = logging.getLogger(__name__)

# The kubelet never gives a container less than this to stop (minimumGracePeriodInSeconds).
MINIMUM_GRACE_SECONDS = 2

# Sandbox and container starts in flight at once. A small board's runtime starts 110 pods faster
# 8 at a time than all at once (make bench: 7.7 s against 9.1 s for the same burst); image pulls
# are not held by this gate. Containers of pods under way go before new sandboxes (startgate.py).
MAX_PARALLEL_STARTS = 8

# How soon a sync looks again at a create or start under way in the runtime (this agent's or an earlier one's).
IN_FLIGHT_RECHECK_SECONDS = 0.5


class ContainerConfigError(EdgeletError):
    """The container cannot be configured (missing ConfigMap key, bad volume, ...): CreateContainerConfigError."""


@dataclass(slots=True)
class SyncResult:
    """What a sync left for the status: waiting reasons per container and when to look again."""

    waiting_reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    requeue_after: float | None = None
    started: list[str] = field(default_factory=list)
    stopped: bool = False  # it stopped containers, or the whole pod
    # A create or start is under way in the runtime: the next sync must see the runtime's state as it is now.
    reinspect: bool = False

    def requeue(self, delay: float) -> None:
        self.requeue_after = delay if self.requeue_after is None else min(self.requeue_after, delay)


class DeviceOptions(Protocol):
    """What the manager asks of the device manager (edgelet.cm.devicemanager): what a container's devices add to
    its config, None when it has none; an EdgeletError when they cannot be given now."""

    async def container_options(self, pod: Pod, container: dict) -> Any: ...


class LifecycleHooks(Protocol):
    """What the manager asks of the hook runner (edgelet.prober.HookRunner, which imports this module)."""

    async def post_start(self, pod: Pod, container: Mapping[str, Any], container_id: str) -> str | None: ...

    async def pre_stop(self, pod: Pod, name: str, container_id: str, grace: int) -> int: ...


@dataclass(slots=True)
class Collaborators:
    """What the manager needs from the other managers; each is optional for a bare node."""

    images: ImageManager
    volumes: VolumeManager | None = None
    store: ObjectStore | None = None  # ConfigMaps and Secrets for env and pull secrets
    hooks: LifecycleHooks | None = None
    resizer: Resizer | None = None  # in-place resizes
    devices: DeviceOptions | None = None  # device plugins' devices, mounts and variables
    recorder: Recorder = NO_EVENTS  # the kubelet's container and sandbox events


class RuntimeManager:
    def __init__(
        self,
        runtime: RuntimeClient,
        collaborators: Collaborators,
        *,
        logs_root: str,
        crash_backoff: Backoff,
        container_logs_dir: str = "",
        cluster_dns: Sequence[str] = (),
        cluster_domain: str = "cluster.local",
        runtime_handler: str = "",
        node_ip: Callable[[], str] = lambda: "",
        node_allocatable: dict[str, str] | None = None,
        cpuset_for: Callable[[Pod, dict], str] = lambda pod, container: "",
        cgroup_parent: Callable[[Pod, bool], Awaitable[str]] | None = None,
        hasher: Callable[[str, str], str] | None = None,
        security: SecuritySettings = SecuritySettings(),
    ):
        self._runtime = runtime
        self._images = collaborators.images
        self._volumes = collaborators.volumes
        self._store = collaborators.store
        self._hooks = collaborators.hooks
        self._resizer = collaborators.resizer
        self._devices = collaborators.devices
        self._recorder = collaborators.recorder
        self._logs_root = logs_root
        self._container_logs_dir = container_logs_dir  # where the collectors' links go; "" for none
        self._backoff = crash_backoff
        self._cluster_dns = list(cluster_dns)
        self._cluster_domain = cluster_domain
        self._runtime_handler = runtime_handler
        self._node_ip = node_ip
        self._node_allocatable = node_allocatable
        self._cpuset_for = cpuset_for
        self._cgroup_parent = cgroup_parent
        self._security = security
        self._service_env: Callable[[Pod], Mapping[str, str]] = lambda pod: {}
        self._fetch_missing: Callable[[Pod], Awaitable[None]] | None = None
        self._start_gate = StartGate(MAX_PARALLEL_STARTS)
        self._failed_starts: set[str] = set()  # containers whose StartContainer failed in this agent
        self._starts = StartLog()  # creates and starts under way in the runtime, and creates it refused
        if hasher is None:
            from ..core import container_hash
            hasher = container_hash
        self._hash = hasher

    def resize_view(self, pod: Pod):
        """What the status shows of the pod's resources and resizes (None without a resizer)."""
        return self._resizer.view(pod) if self._resizer is not None else None

    def use_service_env(self, service_env: Callable[[Pod], Mapping[str, str]]) -> None:
        """Where a container's Service variables come from (cluster mode: the service informer's `env_for`, which
        raises EnvError, a CreateContainerConfigError, until the Services were first listed)."""
        self._service_env = service_env

    def fetch_objects_with(self, fetch_missing: Callable[[Pod], Awaitable[None]]) -> None:
        """Cluster mode: ConfigMaps and Secrets a pod references but the store lacks are read (GET) before its
        volumes and containers are made, so only the API server's NotFound makes them absent."""
        self._fetch_missing = fetch_missing

    # -- SyncPod ------------------------------------------------------------------------------

    async def sync_pod(
        self,
        pod: Pod,
        status: PodRuntimeStatus,
        *,
        liveness_failed: Collection[str] = (),
        startup_failed: Collection[str] = (),
        startup_succeeded: Collection[str] = (),
    ) -> SyncResult:
        result = SyncResult()
        actions = compute_pod_actions(
            pod, status, liveness_failed=liveness_failed, startup_failed=startup_failed,
            startup_succeeded=startup_succeeded, hasher=self._hash, in_flight=self._starts.pending(status),
        )
        if self._fetch_missing is not None:
            await self._fetch_missing(pod)
        if actions.awaited:
            log.debug("pod %s: waiting for the runtime to finish creating or starting %s", podutil.full_name(pod),
                      ", ".join(actions.awaited))
            result.requeue(IN_FLIGHT_RECHECK_SECONDS)
            result.reinspect = True
        # Volumes first, on every sync: ConfigMap, Secret and downward API contents follow their
        # sources even when no container changes (the kubelet remounts on each sync too).
        volume_paths = await self._setup_volumes(pod, result)
        if volume_paths is None:
            return result
        # Step 0: a changed `resources` reaches the running containers in place (the resizer decides how).
        if self._resizer is not None and actions.kill_pod:
            self._resizer.starting(pod)
        elif self._resizer is not None:
            async def restart(spec: dict, change) -> None:
                await self._restart_for_resize(pod, spec, change.container_id, status, actions, volume_paths, result)
            again = await self._resizer.sync(pod, status, restart)
            if again is not None:
                result.requeue(again)
        if actions.no_change():
            return result
        log.debug("pod %s actions: %s", podutil.full_name(pod), actions)

        # Step 1: kill the pod if its sandbox changed or it is done, else kill the containers that must go.
        if actions.kill_pod:
            if actions.create_sandbox and status.sandboxes:
                self._recorder.event(pod_ref(pod), NORMAL, "SandboxChanged",
                                     "Pod sandbox changed, it will be killed and re-created.")
            result.stopped = await self.kill_pod(pod, status, None)
            if not actions.create_sandbox:
                return result
            await self._purge_init_containers(pod, status)
        elif actions.containers_to_kill:
            result.stopped = True
            await asyncio.gather(*(
                self._stop_container(kill.container_id, kill.name, kill_grace_seconds(pod, kill),
                                     pod, f"{kill.reason}: {kill.message}", event_message=kill.message)
                for kill in actions.containers_to_kill.values()
            ))

        # Step 2: a new sandbox when needed.
        sandbox_id = actions.sandbox_id
        create = actions.create_sandbox and self._needs_sandbox(actions)
        if actions.create_sandbox and not create:
            return result
        # The pod cgroup is made (and limited) before the sandbox that lives in it, as the kubelet's SyncPod does.
        cgroup_parent = await self._cgroup_parent(pod, create) if self._cgroup_parent is not None else ""
        sandbox_config = make_sandbox_config(
            pod, actions.attempt, logs_root=self._logs_root,
            cluster_dns=self._cluster_dns, cluster_domain=self._cluster_domain, cgroup_parent=cgroup_parent,
        )
        prepared: dict[str, asyncio.Future[pb.ContainerConfig | None]] = {}
        history = status  # every container the pod still has, whose restart counts a new one counts on from
        try:
            if create:
                self._starts.new_sandbox(status.uid)
                sandbox_id, pod_ip, prepared = await self._run_sandbox(pod, actions, sandbox_config, volume_paths,
                                                                       result, history)
                status = PodRuntimeStatus(uid=status.uid)  # a fresh sandbox starts from no containers
            else:
                pod_ip = await self._pod_ip(sandbox_id, pod)
            start = functools.partial(self._start_container, pod, status=status, sandbox_id=sandbox_id,
                                      sandbox_config=sandbox_config, volume_paths=volume_paths, pod_ip=pod_ip,
                                      result=result, prepared=prepared, history=history)

            # Step 3: ephemeral containers, before init containers so that a pod stuck initializing can be
            # debugged.
            ephemeral = podutil.ephemeral_containers(pod)
            for index in actions.ephemeral_containers_to_start:
                await start(ephemeral[index], container_type="ephemeral")

            # Step 4: init containers in spec order; a plain one that cannot start holds back what follows it,
            # a sidecar that cannot start is retried on a later sync without holding the others.
            init_specs = podutil.init_containers(pod)
            for index in actions.init_containers_to_start:
                started = await start(init_specs[index], container_type="init")
                if not started and not podutil.is_sidecar(init_specs[index]):
                    return result

            # Step 5: the app containers, in parallel like the kubelet's goroutines per pod start.
            specs = podutil.containers(pod)
            await asyncio.gather(*(start(specs[i], container_type="regular") for i in actions.containers_to_start))
            return result
        finally:
            for preparation in prepared.values():
                preparation.cancel()  # a sync cut short: what was made ready for it is not used

    async def _run_sandbox(self, pod: Pod, actions: PodActions, sandbox_config: pb.PodSandboxConfig,
                           volume_paths: dict[str, str], result: SyncResult, history: PodRuntimeStatus,
                           ) -> tuple[str, str, dict[str, asyncio.Future[pb.ContainerConfig | None]]]:
        """RunPodSandbox, while the containers that start first in it are made ready: their images ensured and
        their configs built (once the pod's IP is known: at once for a pod on the node's network). Returns the
        sandbox id, the pod's IP and each of those containers' preparation by name."""
        pod_ip: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if podutil.host_network(pod):
            pod_ip.set_result(self._node_ip())
        first = ([podutil.init_containers(pod)[i] for i in actions.init_containers_to_start]
                 or [podutil.containers(pod)[i] for i in actions.containers_to_start])
        prepared: dict[str, asyncio.Future[pb.ContainerConfig | None]] = {}
        try:
            async with self._start_gate.slot(under_way=False):
                # Started inside the slot, so that a burst prepares no more pods ahead than it starts sandboxes.
                for spec in first:
                    prepared[spec["name"]] = asyncio.ensure_future(self._prepare_container(
                        pod, spec, status=None, restart_count=next_restart_count(history, spec["name"]),
                        volume_paths=volume_paths, pod_ip=pod_ip,
                        log_directory=os.path.join(sandbox_config.log_directory, spec["name"]), result=result,
                        container_type="init" if actions.init_containers_to_start else "regular"))
                try:
                    sandbox_id = await self._runtime.run_pod_sandbox(sandbox_config, self._runtime_handler)
                except EdgeletError as exc:
                    self._recorder.event(pod_ref(pod), WARNING, "FailedCreatePodSandBox",
                                         f"Failed to create pod sandbox: {exc}")
                    raise
            log.info("pod %s: started sandbox %s (attempt %d)", podutil.full_name(pod), sandbox_id[:13],
                     actions.attempt)
            if not pod_ip.done():
                pod_ip.set_result(await self._pod_ip(sandbox_id, pod))
        except BaseException:
            for preparation in prepared.values():
                preparation.cancel()
            raise
        return sandbox_id, pod_ip.result(), prepared

    @staticmethod
    def _needs_sandbox(actions: PodActions) -> bool:
        return bool(actions.init_containers_to_start or actions.containers_to_start)

    async def _setup_volumes(self, pod: Pod, result: SyncResult) -> dict[str, str] | None:
        if self._volumes is None:
            return {}
        try:
            return await self._volumes.setup_pod(pod)
        except EdgeletError as exc:
            for container in podutil.all_containers(pod):
                result.waiting_reasons[container["name"]] = ("CreateContainerConfigError", str(exc))
            result.requeue(10.0)
            log.warning("pod %s: volumes: %s", podutil.full_name(pod), exc)
            self._recorder.event(pod_ref(pod), WARNING, "FailedMount", str(exc))
            return None

    async def _pod_ip(self, sandbox_id: str, pod: Pod) -> str:
        if podutil.host_network(pod):
            return self._node_ip()
        try:
            reply = await self._runtime.pod_sandbox_status(sandbox_id)
        except EdgeletError:
            return ""
        return reply.status.network.ip

    async def _purge_init_containers(self, pod: Pod, status: PodRuntimeStatus) -> None:
        init_names = {c["name"] for c in podutil.init_containers(pod)}
        for container in status.containers:
            if container.name in init_names and container.state != ContainerState.RUNNING:
                await self._runtime.remove_container(container.id)

    # -- starting a container ---------------------------------------------------------------

    def forget_crash_backoff(self) -> None:
        """Containers that ended because the runtime went away did not crash: none of it counts toward
        CrashLoopBackOff, so pods come back at once when the runtime does."""
        self._backoff.clear()

    def backoff_key(self, pod: Pod, container: dict) -> str:
        return f"{podutil.uid(pod)}_{container['name']}_{self._hash(container['name'], container.get('image', ''))}"

    async def _start_container(
        self,
        pod: Pod,
        container: dict,
        *,
        status: PodRuntimeStatus,
        sandbox_id: str,
        sandbox_config: pb.PodSandboxConfig,
        volume_paths: dict[str, str],
        pod_ip: str,
        result: SyncResult,
        container_type: str,
        prepared: Mapping[str, Awaitable[pb.ContainerConfig | None]] | None = None,
        history: PodRuntimeStatus | None = None,
    ) -> bool:
        """Starts one container (init, regular or ephemeral); True when it runs now or its start is under way.
        A container of a sandbox just made may have been made ready while the sandbox started (`prepared`).
        `history` is the pod's status before a new sandbox (default `status`): restart counts go on from it."""
        name = container["name"]
        if self._create_held_back(pod, name, result):
            return False
        if prepared and name in prepared:
            config = await prepared[name]
            return config is not None and await self._create_and_start(
                pod, container, config, sandbox_id, sandbox_config, result, container_type, config.metadata.attempt)
        previous = status.latest_container(name)
        restart_count = next_restart_count(history or status, name)
        if previous is not None and previous.state == ContainerState.CREATED:
            # Created but never started (the agent died in between): start that one rather than a second.
            if await self._adopt_created(pod, container, previous, sandbox_id, result, container_type):
                return True
            restart_count = await self._replacement_count(pod, name, previous)
        elif previous is not None and self._start_cut_short(previous):
            # An earlier agent died during its StartContainer and the runtime gave the start up: the
            # container never ran, so its replacement is no restart and no crash (no back-off).
            log.info("pod %s: container %s (%s) never ran, its start was cut short by a restart of the agent; "
                     "replacing it", podutil.full_name(pod), name, previous.id[:13])
            restart_count = await self._replacement_count(pod, name, previous)
        # Restart back-off (CrashLoopBackOff) applies to containers that ran and ended before.
        elif previous is not None and previous.state == ContainerState.EXITED:
            key = self.backoff_key(pod, container)
            if self._backoff.in_backoff(key):
                remaining = self._backoff.remaining(key)
                result.waiting_reasons[name] = (
                    "CrashLoopBackOff",
                    f"back-off {self._backoff.delay(key):.0f}s restarting failed container={name} "
                    f"pod={podutil.full_name(pod)}({podutil.uid(pod)})",
                )
                result.requeue(remaining)
                self._recorder.event(pod_ref(pod, name), WARNING, "BackOff", "Back-off restarting failed container")
                return False
            self._backoff.next(key)
            self._failed_starts.discard(previous.id)  # its replacement is the one to watch from now on
        config = await self._prepare_container(
            pod, container, status=status, restart_count=restart_count, volume_paths=volume_paths, pod_ip=pod_ip,
            log_directory=os.path.join(sandbox_config.log_directory, name), result=result,
            container_type=container_type)
        return config is not None and await self._create_and_start(pod, container, config, sandbox_id,
                                                                   sandbox_config, result, container_type,
                                                                   restart_count)

    async def _prepare_container(self, pod: Pod, container: dict, *, status: PodRuntimeStatus | None,
                                 restart_count: int, volume_paths: dict[str, str], pod_ip: str | Awaitable[str],
                                 log_directory: str, result: SyncResult, container_type: str,
                                 ) -> pb.ContainerConfig | None:
        """The container's image made present and its CreateContainer config built (`pod_ip` may be still to
        come: it is awaited after the image); None, with the failure in `result`, when either cannot be.
        `status` is the pod's, for an ephemeral container's target."""
        name = container["name"]
        try:
            image_ref = await self._images.ensure_image(pod, container, self._pull_secrets(pod))
        except EdgeletError as exc:
            reason = getattr(exc, "reason", "ErrImagePull")
            self._failed(pod, name, result, container_type, reason, getattr(exc, "message", str(exc)),
                         getattr(exc, "retry_after", None) or 1.0, event_message=reason)
            return None
        if not isinstance(pod_ip, str):
            pod_ip = await pod_ip
        try:
            pid_target = self._pid_target(container, status) if container_type == "ephemeral" else ""
            return await self._container_config(pod, container, image_ref, restart_count, volume_paths, pod_ip,
                                                pid_target=pid_target, log_directory=log_directory)
        except EdgeletError as exc:
            self._failed(pod, name, result, container_type, "CreateContainerConfigError", str(exc), 10.0)
            return None

    async def _create_and_start(self, pod: Pod, container: dict, config: pb.ContainerConfig, sandbox_id: str,
                                sandbox_config: pb.PodSandboxConfig, result: SyncResult, container_type: str,
                                restart_count: int) -> bool:
        """CreateContainer and StartContainer, then the postStart hook; as `_start_container` answers."""
        name = container["name"]
        async with self._start_gate.slot(under_way=True):
            try:
                container_id = await self._runtime.create_container(sandbox_id, config, sandbox_config)
            except EdgeletError as exc:
                if isinstance(exc, RuntimeTimeout) or create_in_flight(exc):
                    # The runtime may still be creating it (ours timed out, or the name is reserved by a create
                    # under way): the sync that sees it created starts it; none creates a second one.
                    log.info("pod %s: container %s is still being created (%s); waiting for the runtime",
                             podutil.full_name(pod), name, exc)
                    self._await(pod, result, name, restart_count)
                    return True
                delay = self._starts.refused(podutil.uid(pod), name, str(exc))
                self._failed(pod, name, result, container_type, "CreateContainerError", str(exc), delay)
                return False
            self._starts.created(podutil.uid(pod), name)
            self._recorder.event(pod_ref(pod, name), NORMAL, "Created", f"Created container {name}")
            try:
                await self._runtime.start_container(container_id)
            except RuntimeTimeout as exc:
                log.info("pod %s: container %s (%s) is still being started (%s); waiting for the runtime",
                         podutil.full_name(pod), name, container_id[:13], exc)
                self._await(pod, result, name, restart_count, container_id)
                return True
            except EdgeletError as exc:
                self._failed_starts.add(container_id)
                self._failed(pod, name, result, container_type, "RunContainerError", str(exc), 1.0)
                return False
        self._recorder.event(pod_ref(pod, name), NORMAL, "Started", f"Started container {name}")
        metrics.started_containers.labels(container_type).inc()
        if self._container_logs_dir:
            self._link_log(config, sandbox_config, container_id)
        result.started.append(name)
        log.info("pod %s: started container %s (%s, restart %d)", podutil.full_name(pod), name,
                 container_id[:13], restart_count)
        return await self._post_start(pod, container, container_id, result)

    def _link_log(self, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig, container_id: str) -> None:
        """The collectors' link to a started container's log, where the runtime has opened the file (as the
        kubelet does after StartContainer)."""
        target = os.path.join(sandbox_config.log_directory, config.log_path)
        if os.path.exists(target):
            meta = sandbox_config.metadata
            make_link(self._container_logs_dir, link_name(meta.name, meta.namespace, config.metadata.name,
                                                          container_id), target)

    async def _post_start(self, pod: Pod, container: dict, container_id: str, result: SyncResult) -> bool:
        """The container's postStart hook; when it fails the container is killed (the kubelet's
        FailedPostStartHook), preStop hook and all, and waits as PostStartHookError. False when it failed."""
        if self._hooks is None:
            return True
        failure = await self._hooks.post_start(pod, container, container_id)
        if not failure:
            return True
        name = container["name"]
        result.waiting_reasons[name] = ("PostStartHookError", failure)
        try:
            # The kubelet gives such a kill the minimum grace at least, even for a pod whose grace is 0.
            await self._stop_container(container_id, name,
                                       max(podutil.grace_period_seconds(pod), MINIMUM_GRACE_SECONDS), pod,
                                       "FailedPostStartHook", event_message="FailedPostStartHook")
        except EdgeletError as exc:
            log.warning("pod %s: stopping container %s (%s) failed: %s", podutil.full_name(pod), name,
                        container_id[:13], exc)
        return False

    async def _adopt_created(self, pod: Pod, container: dict, created: ContainerStatus, sandbox_id: str,
                             result: SyncResult, container_type: str) -> bool:
        """Starts a container an earlier run created but did not start, when it is of this sandbox and spec;
        otherwise False: the caller removes it and creates a fresh one. True when it was started or
        an earlier StartContainer of it is still in flight in the runtime (the next sync looks again)."""
        name = container["name"]
        why = "it belongs to an older sandbox or spec"
        if created.sandbox_id == sandbox_id and created.hash == self._hash(name, container.get("image", "")):
            try:
                async with self._start_gate.slot(under_way=True):
                    await self._runtime.start_container(created.id)
            except EdgeletError as exc:
                if isinstance(exc, RuntimeTimeout) or start_in_flight(exc):
                    # A StartContainer (this one, timed out, or an earlier one) still runs in the runtime; it ends
                    # RUNNING or EXITED (never ran), and either is handled by the sync that sees it. Removing it
                    # or starting another would start the container twice.
                    log.debug("pod %s: container %s (%s) is still being started", podutil.full_name(pod), name,
                              created.id[:13])
                    self._await(pod, result, name, created.restart_count, created.id)
                    return True
                why = f"it cannot be started: {exc}"
            else:
                self._recorder.event(pod_ref(pod, name), NORMAL, "Started", f"Started container {name}")
                metrics.started_containers.labels(container_type).inc()
                result.started.append(name)
                log.info("pod %s: started container %s (%s) created before a restart", podutil.full_name(pod),
                         name, created.id[:13])
                await self._post_start(pod, container, created.id, result)
                return True
        log.info("pod %s: replacing container %s (%s) that was created but never started (%s)",
                 podutil.full_name(pod), name, created.id[:13], why)
        return False

    def _start_cut_short(self, container: ContainerStatus) -> bool:
        """An exited container that never ran and whose start this agent did not attempt: an earlier agent's
        StartContainer, abandoned by the runtime when that agent died. Starts that failed here count as usual."""
        return (container.state == ContainerState.EXITED and container.started_at == 0
                and container.id not in self._failed_starts)

    async def _replacement_count(self, pod: Pod, name: str, never_run: ContainerStatus) -> int:
        """Removes a container that never ran so that its replacement takes its name and restart count (it is no
        restart). A runtime that keeps it (containerd 2.x cannot remove a container whose start was cancelled while
        it made the task: "cannot delete running task") still gets the pod running: the replacement takes the next
        attempt, as the kubelet's would, and container GC keeps trying the old one. A removal refused because the
        container's start is still under way is raised: the sync after it sees how that start ended."""
        replacement = never_run.restart_count
        try:
            await self._runtime.remove_container(never_run.id)
        except NotFound:
            pass
        except CRIError as exc:
            if in_starting_state(exc):
                raise
            replacement += 1
            log.warning("pod %s: the runtime keeps container %s (%s), which never ran (%s); its replacement is "
                        "attempt %d", podutil.full_name(pod), name, never_run.id[:13], exc, replacement)
        self._failed_starts.discard(never_run.id)
        return replacement

    def _await(self, pod: Pod, result: SyncResult, name: str, attempt: int, container_id: str = "") -> None:
        """A create (no `container_id`) or start whose end the agent did not see: the next syncs await it."""
        self._starts.under_way(podutil.uid(pod), name, attempt, container_id)
        result.requeue(IN_FLIGHT_RECHECK_SECONDS)
        result.reinspect = True

    def _create_held_back(self, pod: Pod, name: str, result: SyncResult) -> bool:
        """Whether the container's last create was refused too recently to try again (its reason stays shown)."""
        held = self._starts.held_back(podutil.uid(pod), name)
        if held is None:
            return False
        result.waiting_reasons[name] = ("CreateContainerError", held[1])
        result.requeue(held[0])
        return True

    def _failed(self, pod: Pod, name: str, result: SyncResult, container_type: str, reason: str, message: str,
                retry_after: float, event_message: str | None = None) -> None:
        """A container that could not start: its waiting reason, the retry, the metric and the Failed event."""
        result.waiting_reasons[name] = (reason, message)
        result.requeue(retry_after)
        metrics.started_containers_errors.labels(container_type, reason).inc()
        self._recorder.event(pod_ref(pod, name), WARNING, "Failed", f"Error: {event_message or message}")

    def _pull_secrets(self, pod: Pod) -> list[dict]:
        if self._store is None:
            return []
        secrets = []
        for ref in podutil.spec(pod).get("imagePullSecrets") or []:
            secret = self._store.get_secret(podutil.namespace(pod), ref.get("name", ""))
            if secret is not None:
                secrets.append(secret)
        return secrets

    @staticmethod
    def _pid_target(container: dict, status: PodRuntimeStatus | None) -> str:
        """The id of the container whose processes an ephemeral container is to see (targetContainerName)."""
        target = container.get("targetContainerName")
        if not target:
            return ""
        latest = status.latest_container(target) if status is not None else None
        if latest is None or latest.state != ContainerState.RUNNING:
            raise ContainerConfigError(f"target container {target!r} is not running")
        return latest.id

    async def _container_config(self, pod: Pod, container: dict, image_ref: str, restart_count: int,
                                volume_paths: dict[str, str], pod_ip: str, *, pid_target: str = "",
                                log_directory: str) -> pb.ContainerConfig:
        """The CreateContainer config, with what it names on the host made ready: the mounts' files and the
        container's log directory (`log_directory`), written in a thread: a slow disk must not stall every other
        pod's work for each container started."""
        from edgelet.api.env import expand_command, resolve_env
        from edgelet.api.resources import linux_resources

        pod_ips = [pod_ip] if pod_ip else []
        env = resolve_env(pod, container, store=self._store, service_env=self._service_env(pod),
                          node_ip=self._node_ip(),
                          pod_ip=pod_ip, pod_ips=pod_ips, node_allocatable=self._node_allocatable)
        command, args = expand_command(container, env)
        mounts = await asyncio.to_thread(self._prepare_host_files, pod, container, volume_paths, env, pod_ips,
                                         log_directory)
        resources = linux_resources(pod, container)
        if cpuset := self._cpuset_for(pod, container):  # exclusive CPUs of the static CPU policy
            resources["cpuset_cpus"] = cpuset
        image_user = await self._image_user(pod, container, image_ref)
        devices = await self._devices.container_options(pod, container) if self._devices is not None else None
        config = make_container_config(
            pod, container,
            image_ref=image_ref,
            restart_count=restart_count,
            container_hash=self._hash(container["name"], container.get("image", "")),
            env=env, command=command, args=args, mounts=mounts,
            resources=resources, pid_target=pid_target, settings=self._security, image_user=image_user,
        )
        if devices is not None:
            add_device_options(config, devices)
        return config

    async def _image_user(self, pod: Pod, container: dict, image_ref: str) -> tuple[int | None, str]:
        """The image's (uid, username) where runAsNonRoot must be checked against it, as the kubelet's
        getImageUser (neither reported: root); raises ContainerConfigError when the check fails. Other
        containers skip the runtime call: the runtime takes the image's user itself."""
        uid, username = None, ""
        if needs_image_user(pod, container):
            image = await self._runtime.image_status(image_ref)
            if image is not None and image.HasField("uid"):
                uid = image.uid.value
            elif image is not None and image.username:
                username = image.username
            else:
                uid = 0
        if problem := run_as_non_root_error(pod, container, uid, username):
            raise ContainerConfigError(problem)
        return uid, username

    def _prepare_host_files(self, pod: Pod, container: dict, volume_paths: dict[str, str],
                            env: list[tuple[str, str]], pod_ips: list[str], log_directory: str) -> list[dict[str, Any]]:
        """The container's CRI mounts, their files written, and its log directory (blocking I/O).

        The pod's log directory, the sandbox's, is made here with its first container's: the runtime writes nothing
        in it for the sandbox, and made before RunPodSandbox (as the kubelet does) it would cost every pod start a
        thread hop before its sandbox."""
        mounts = (self._volumes.mounts_for(pod, container, volume_paths, env=env, pod_ips=pod_ips)
                  if self._volumes is not None else [])
        for directory in (os.path.dirname(log_directory), log_directory):
            os.makedirs(directory, mode=0o755, exist_ok=True)
        return mounts

    # -- stopping -----------------------------------------------------------------------------

    async def kill_pod(self, pod: Pod, status: PodRuntimeStatus, grace_override: int | None) -> bool:
        """Stops every running container (in parallel, each within the grace period), then the sandboxes;
        True when there was anything to stop.

        Sidecars stop last, in reverse spec order, each within what is left of its grace period once the
        containers it serves have stopped. A pod no source knows any more (an orphan) comes as metadata
        only; its containers then carry the grace period they were started with.
        """
        has_spec = bool(pod.get("spec"))
        running = [c for c in status.containers
                   if c.state in (ContainerState.RUNNING, ContainerState.CREATED, ContainerState.UNKNOWN)]
        ordering = TerminationOrdering(pod, {c.name for c in running}) if has_spec else None
        await asyncio.gather(*(
            self._stop_container(c.id, c.name, self._grace(pod, c, has_spec, grace_override), pod,
                                 "pod is being killed", ordering=ordering)
            for c in running
        ))
        ready = [sandbox for sandbox in status.sandboxes if sandbox.state == SandboxState.READY]
        for sandbox in ready:
            await self._runtime.stop_pod_sandbox(sandbox.id)
        return bool(running or ready)

    @staticmethod
    def _grace(pod: Pod, container: ContainerStatus, has_spec: bool, override: int | None) -> int:
        if override is not None:
            return override
        if not has_spec and container.grace_period >= 0:
            return container.grace_period
        return podutil.grace_period_seconds(pod)

    async def _restart_for_resize(self, pod: Pod, spec: dict, container_id: str, status: PodRuntimeStatus,
                                  actions: PodActions, volume_paths: dict[str, str], result: SyncResult) -> None:
        """resizePolicy RestartContainer: the container stops and starts again with its new resources,
        whatever the pod's restartPolicy (a restart of the kubelet's kind, counted in restartCount)."""
        await self._stop_container(container_id, spec["name"], podutil.grace_period_seconds(pod), pod,
                                   "its resources are resized with resizePolicy RestartContainer")
        sandbox_config = make_sandbox_config(pod, actions.attempt, logs_root=self._logs_root,
                                             cluster_dns=self._cluster_dns, cluster_domain=self._cluster_domain)
        await self._start_container(pod, spec, status=status, sandbox_id=actions.sandbox_id,
                                    sandbox_config=sandbox_config, volume_paths=volume_paths,
                                    pod_ip=await self._pod_ip(actions.sandbox_id, pod), result=result,
                                    container_type="regular")

    async def _stop_container(self, container_id: str, name: str, grace: int, pod: Pod, why: str,
                              event_message: str = "", ordering: TerminationOrdering | None = None) -> None:
        try:
            grace = max(grace, MINIMUM_GRACE_SECONDS) if grace > 0 else 0
            log.info("pod %s: stopping container %s (%s) with %ds grace: %s", podutil.full_name(pod), name,
                     container_id[:13], grace, why)
            if pod.get("spec"):  # an orphan no source knows has no object to attach events to
                self._recorder.event(pod_ref(pod, name), NORMAL, "Killing",
                                     event_message or f"Stopping container {name}")
            if self._hooks is not None and pod.get("spec"):
                grace = await self._hooks.pre_stop(pod, name, container_id, grace)
            if ordering is not None and grace > 0:
                # A sidecar waits for the containers it serves, out of its own grace period (the kubelet
                # truncates the wait to whole seconds and still grants the minimum).
                grace = max(grace - int(await ordering.wait_for_turn(name, grace)), MINIMUM_GRACE_SECONDS)
            await self._runtime.stop_container(container_id, grace)
        finally:
            if ordering is not None:
                ordering.stopped(name)

    async def remove_pod(self, status: PodRuntimeStatus) -> None:
        """Removes the pod's sandboxes and with them its containers (after kill_pod)."""
        self._starts.forget(status.uid)
        if self._resizer is not None:
            self._resizer.forget(status.uid, [c.id for c in status.containers])
        for container in status.containers:
            await self._runtime.remove_container(container.id)
        for sandbox in status.sandboxes:
            await self._runtime.stop_pod_sandbox(sandbox.id)
            await self._runtime.remove_pod_sandbox(sandbox.id)

    def pod_log_dir(self, pod: Pod) -> str:
        return pod_log_dir(self._logs_root, pod)
