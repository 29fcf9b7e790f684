"""What a sync must do to bring a pod's runtime state to its spec: a pure decision over plain data.

`compute_pod_actions` mirrors the kubelet's computePodActions; the manager carries the result out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState

Hasher = Callable[[str, str], str]

# Why a container is killed; the manager puts these into events and logs.
REASON_CHANGED = "Changed"
REASON_UNHEALTHY = "Unhealthy"
REASON_UNKNOWN_STATE = "Unknown"
REASON_NOT_IN_SPEC = "NotInSpec"
LIVENESS_PROBE, STARTUP_PROBE = "livenessProbe", "startupProbe"


@dataclass(slots=True)
class ContainerToKill:
    container_id: str
    name: str
    reason: str
    message: str
    probe: str = ""  # the failed probe that kills it: livenessProbe or startupProbe


def kill_grace_seconds(pod: podutil.Pod, kill: ContainerToKill) -> int:
    """The grace period a container killed during a sync gets (the kubelet's setTerminationGracePeriod): a
    deletion's, else the failed probe's own terminationGracePeriodSeconds, else the pod's."""
    if podutil.meta(pod).get("deletionGracePeriodSeconds") is None and kill.probe:
        spec = next((c for c in podutil.all_containers(pod) if c.get("name") == kill.name), {})
        own = (spec.get(kill.probe) or {}).get("terminationGracePeriodSeconds")
        if isinstance(own, int) and not isinstance(own, bool):
            return max(own, 0)
    return podutil.grace_period_seconds(pod)


@dataclass(slots=True)
class PodActions:
    """The plan for one sync. With `kill_pod`, every container and sandbox of the pod is stopped first
    and `containers_to_kill` is moot. With `create_sandbox`, the manager also removes the pod's old
    init containers before starting the first init container, as the kubelet purges them; otherwise the
    next sync would take them for a finished initialization."""

    kill_pod: bool
    create_sandbox: bool
    sandbox_id: str  # the newest sandbox when it is ready, "" if none is
    attempt: int  # attempt number for a new sandbox, else the highest existing one
    # Indexes into spec.initContainers, in spec order: at most one plain init container (the next one to
    # run), besides sidecars (restartPolicy Always) to start or restart.
    init_containers_to_start: list[int] = field(default_factory=list)
    containers_to_start: list[int] = field(default_factory=list)  # indexes into spec.containers
    ephemeral_containers_to_start: list[int] = field(default_factory=list)  # indexes into spec.ephemeralContainers
    containers_to_kill: dict[str, ContainerToKill] = field(default_factory=dict)  # by container id
    # Containers whose create or start is under way in the runtime (InFlight): neither started nor given up on.
    awaited: list[str] = field(default_factory=list)

    def no_change(self) -> bool:
        return not (
            self.kill_pod
            or self.create_sandbox
            or self.init_containers_to_start
            or self.containers_to_start
            or self.ephemeral_containers_to_start
            or self.containers_to_kill
        )


@dataclass(frozen=True, slots=True)
class InFlight:
    """A CreateContainer or StartContainer of one container that the agent saw no end of: its reply did not come
    within the client's timeout (the runtime carries such a call on), or the runtime answered that the same
    create (its name reserved) or start was still under way. Until the runtime's state shows how it ended, the
    container is neither created nor started again, and its pod is not given up on for it."""

    name: str
    attempt: int  # the restart count the container was created with
    container_id: str = ""  # a start's container; "" for a create
    since: float = 0.0  # when it was last seen under way (the caller's monotonic clock)


def in_flight_ended(op: InFlight, status: PodRuntimeStatus, now: float, patience: float) -> bool:
    """Whether the runtime's state shows the create or start done (or failed): a created container of that
    attempt, a started one out of the created state (or gone). One that shows nothing for `patience` seconds is
    taken as failed and tried again (a create that failed in the runtime leaves nothing to see)."""
    if now - op.since >= patience:
        return True
    if op.container_id:
        container = next((c for c in status.containers if c.id == op.container_id), None)
        return container is None or container.state != ContainerState.CREATED
    return any(c.name == op.name and max(c.attempt, c.restart_count) >= op.attempt for c in status.containers)


def next_restart_count(status: PodRuntimeStatus, name: str) -> int:
    """The restart count of the container's next instance: one past every instance the runtime still has, in any
    sandbox of the pod. The runtime names a container after its pod and restart count (containerd reserves
    `k8s_<name>_<pod>_<namespace>_<uid>_<count>`), so a count still taken makes its create fail "name is
    reserved"; the kubelet counts on from the pod's containers across sandboxes too."""
    return max((max(c.attempt, c.restart_count) for c in status.containers if c.name == name), default=-1) + 1


def default_hasher() -> Hasher:
    """The agent's container hash; imported late so this module stays importable on its own."""
    from edgelet.core import container_hash

    return container_hash


def pod_sandbox_changed(pod: podutil.Pod, status: PodRuntimeStatus) -> tuple[bool, int, str]:
    """(needs a new sandbox, attempt for it, newest ready sandbox id or "").

    A new sandbox is needed when there is none, the newest is not ready, several are ready, or the
    network mode (host or pod network) no longer matches the spec.
    """
    if not status.sandboxes:
        return True, 0, ""
    newest = status.sandboxes[0]
    max_attempt = max(s.attempt for s in status.sandboxes)
    ready_id = newest.id if newest.state == SandboxState.READY else ""
    ready_count = sum(1 for s in status.sandboxes if s.state == SandboxState.READY)
    if ready_count > 1 or not ready_id:
        return True, max_attempt + 1, ready_id
    if newest.host_network != podutil.host_network(pod):
        return True, max_attempt + 1, ready_id
    return False, max_attempt, ready_id


def should_restart(pod: podutil.Pod, container_spec: dict[str, Any], latest: ContainerStatus | None) -> bool:
    """Whether a (not running) app container or sidecar is to be started again, given its newest instance."""
    if podutil.deletion_requested(pod):
        return False
    if latest is None:
        return True  # never ran, or every instance was garbage collected
    if latest.state == ContainerState.RUNNING:
        return False
    if latest.state in (ContainerState.UNKNOWN, ContainerState.CREATED):
        return True  # it may never have run: try again
    if podutil.is_sidecar(container_spec):
        return True  # a sidecar's own restartPolicy Always beats the pod's
    policy = podutil.restart_policy(pod)
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return latest.exit_code != 0
    return True


def init_container_failed(status: ContainerStatus) -> bool:
    if status.reason == "OOMKilled":
        return True
    if status.state == ContainerState.EXITED and status.exit_code != 0:
        return True
    return status.state == ContainerState.UNKNOWN


@dataclass(frozen=True, slots=True)
class ProbeResults:
    """Probe results of one pod, as sets of container ids (results belong to one container instance, as the
    kubelet's prober results do). `startup_succeeded` lets a sidecar with a startup probe count as started."""

    liveness_failed: Collection[str] = ()
    startup_failed: Collection[str] = ()
    startup_succeeded: Collection[str] = ()


def pod_has_initialized(pod: podutil.Pod, status: PodRuntimeStatus) -> bool:
    """A created or running app container proves initialization finished, even if the init containers were
    since removed from the runtime. Exited ones do not: after a reboot every container is exited and the new
    sandbox has to initialize again."""
    for spec in podutil.containers(pod):
        latest = status.latest_container(spec.get("name", ""))
        if latest is not None and latest.state in (ContainerState.CREATED, ContainerState.RUNNING):
            return True
    return False


def compute_init_container_actions(
    pod: podutil.Pod, status: PodRuntimeStatus, actions: PodActions, probes: ProbeResults, hash_of: Hasher
) -> bool:
    """Fills in the init containers to start (and sidecars to kill); True once the pod has initialized.

    The kubelet's computeInitContainerActions: the init containers are walked from the last one back, since
    finished ones may have been removed from the runtime and the last one known tells the most. A sidecar
    counts as done once it runs (and its startup probe passed, if it has one); it is restarted whenever it
    exits, and kept running after initialization. A failed plain init container under restartPolicy Never
    kills the pod.
    """
    specs = podutil.init_containers(pod)
    if not specs:
        return True
    initialized = pod_has_initialized(pod, status)
    previously_initialized = initialized  # whether the init containers before the current one are done
    restart_on_failure = podutil.restart_policy(pod) != "Never"
    to_start: list[int] = []
    last = len(specs) - 1

    for index in range(last, -1, -1):
        spec = specs[index]
        name = spec.get("name", "")
        sidecar = podutil.is_sidecar(spec)
        latest = status.latest_container(name)
        if latest is None:
            if previously_initialized and sidecar:
                to_start.append(index)  # lost from the runtime after initialization: it has to run again
            continue
        if previously_initialized and not sidecar:
            continue  # after initialization only sidecars need to keep running

        if latest.state == ContainerState.CREATED:
            to_start.append(index)  # its start failed half-way; starting it again unsticks it
        elif latest.state == ContainerState.RUNNING:
            if sidecar:
                _sidecar_running(spec, latest, index, last, previously_initialized, actions, probes, hash_of,
                                 to_start)
                if index == last and _sidecar_started(spec, latest, probes):
                    initialized = True
        elif latest.state == ContainerState.EXITED:
            if sidecar:
                to_start.append(index)
            elif init_container_failed(latest):
                if not restart_on_failure:
                    actions.kill_pod = True
                    actions.init_containers_to_start = []
                    return False
                to_start.append(index)
            elif index == last:
                initialized = True
            else:
                to_start.append(index + 1)  # done: the next one runs
        else:  # unknown: it may still run, so kill it before it runs again
            if not sidecar and not restart_on_failure:
                actions.kill_pod = True
                actions.init_containers_to_start = []
                return False
            kind = "Container" if sidecar else "Init container"
            _kill(actions, latest, REASON_UNKNOWN_STATE, f"{kind} is in an unknown state, killing it before restart")
            to_start.append(index)
        previously_initialized = True

    if not previously_initialized:
        to_start.append(0)  # nothing ran yet: the first one starts
    actions.init_containers_to_start = sorted(set(to_start))
    return initialized


def _sidecar_started(spec: dict[str, Any], latest: ContainerStatus, probes: ProbeResults) -> bool:
    return not spec.get("startupProbe") or latest.id in probes.startup_succeeded


def _sidecar_running(
    spec: dict[str, Any], latest: ContainerStatus, index: int, last: int, previously_initialized: bool,
    actions: PodActions, probes: ProbeResults, hash_of: Hasher, to_start: list[int],
) -> None:
    """A running sidecar: the next init container may start once it has started; a failed startup or
    liveness probe or a changed definition restarts it."""
    name = spec.get("name", "")
    if spec.get("startupProbe") and latest.id not in probes.startup_succeeded:
        if latest.id in probes.startup_failed:
            _kill(actions, latest, REASON_UNHEALTHY, f"Init container {name} failed startup probe", STARTUP_PROBE)
            to_start.append(index)
        return  # not started yet: what comes after it waits
    if index != last and not previously_initialized:
        to_start.append(index + 1)  # started for the first time: the next init container runs
    if latest.hash != hash_of(name, spec.get("image", "")):
        _kill(actions, latest, REASON_CHANGED, f"Init container {name} definition changed")
        to_start.append(index)
    elif latest.id in probes.liveness_failed:
        _kill(actions, latest, REASON_UNHEALTHY, f"Init container {name} failed liveness probe", LIVENESS_PROBE)
        to_start.append(index)


def has_any_regular_container_created(pod: podutil.Pod, status: PodRuntimeStatus) -> bool:
    return any(status.latest_container(spec.get("name", "")) is not None for spec in podutil.containers(pod))


def compute_pod_actions(
    pod: podutil.Pod,
    status: PodRuntimeStatus,
    *,
    liveness_failed: Collection[str] = (),
    startup_failed: Collection[str] = (),
    startup_succeeded: Collection[str] = (),
    hasher: Hasher | None = None,
    in_flight: Collection[InFlight] = (),
) -> PodActions:
    """Decide this sync's actions. `liveness_failed`, `startup_failed` and `startup_succeeded` hold container
    ids by probe result (see ProbeResults); `hasher(name, image)` gives the expected
    `io.kubernetes.container.hash`. Restart backoff is left to the caller: `containers_to_start` and
    `init_containers_to_start` list every container that should run again. `in_flight` holds the creates and
    starts not seen to end yet (the caller drops those `in_flight_ended`): their containers are awaited, never
    started a second time, and a pod whose containers are all awaited or running is kept. Nothing about a
    container changes the decision on the sandbox, which follows the sandbox's own state alone."""
    create, attempt, sandbox_id = pod_sandbox_changed(pod, status)
    actions = PodActions(kill_pod=create, create_sandbox=create, sandbox_id=sandbox_id, attempt=attempt)

    if podutil.deletion_requested(pod):
        # A pod being deleted only winds down; nothing is created or restarted.
        actions.kill_pod = True
        actions.create_sandbox = False
        return actions

    specs = podutil.containers(pod)
    restart_policy = podutil.restart_policy(pod)
    if create:
        if restart_policy == "Never" and attempt != 0 and status.containers:
            # It ran once and must not run again: just make sure everything is stopped.
            actions.create_sandbox = False
            return actions
        to_start = [
            index
            for index, spec in enumerate(specs)
            if not (restart_policy == "OnFailure" and _succeeded(status.latest_container(spec.get("name", ""))))
        ]
        if not to_start and has_any_regular_container_created(pod, status):
            actions.create_sandbox = False  # every app container is done: initialization happened before
            return actions
        if podutil.init_containers(pod):
            actions.init_containers_to_start = [0]
            return actions
        actions.containers_to_start = to_start
        return actions

    _kill_containers_not_in_spec(pod, status, actions)

    # Ephemeral containers run once each, even while initialization is unfinished or failing.
    actions.ephemeral_containers_to_start = [
        index for index, spec in enumerate(podutil.ephemeral_containers(pod))
        if status.latest_container(spec.get("name", "")) is None
    ]

    hash_of = hasher or default_hasher()
    probes = ProbeResults(liveness_failed, startup_failed, startup_succeeded)
    initialized = compute_init_container_actions(pod, status, actions, probes, hash_of)
    awaited = {op.name for op in in_flight}
    if awaited and actions.init_containers_to_start:
        init_specs = podutil.init_containers(pod)
        actions.awaited.extend(init_specs[i].get("name", "") for i in actions.init_containers_to_start
                               if init_specs[i].get("name", "") in awaited)
        actions.init_containers_to_start = [i for i in actions.init_containers_to_start
                                            if init_specs[i].get("name", "") not in awaited]
    if actions.kill_pod or not initialized:
        return actions

    keep = 0
    for index, spec in enumerate(specs):
        name = spec.get("name", "")
        latest = status.latest_container(name)
        if name in awaited and (latest is None or latest.state != ContainerState.RUNNING):
            actions.awaited.append(name)  # its create or start is under way: it may be about to run
            keep += 1
            continue
        if latest is None or latest.state != ContainerState.RUNNING:
            if should_restart(pod, spec, latest):
                actions.containers_to_start.append(index)
                if latest is not None and latest.state == ContainerState.UNKNOWN:
                    # It may still be running; never let two instances of one container run.
                    _kill(actions, latest, REASON_UNKNOWN_STATE,
                          "Container is in an unknown state, killing it before restart")
            continue

        restart = restart_policy != "Never"
        probe = ""
        if latest.hash != hash_of(name, spec.get("image", "")):
            reason, message = REASON_CHANGED, f"Container {name} definition changed"
            restart = True  # a new definition runs whatever the restart policy says
        elif latest.id in liveness_failed:
            reason, message, probe = REASON_UNHEALTHY, f"Container {name} failed liveness probe", LIVENESS_PROBE
        elif latest.id in startup_failed:
            reason, message, probe = REASON_UNHEALTHY, f"Container {name} failed startup probe", STARTUP_PROBE
        else:
            keep += 1
            continue
        if restart:
            message += ", will be restarted"
            actions.containers_to_start.append(index)
        _kill(actions, latest, reason, message, probe)

    if keep == 0 and not actions.containers_to_start:
        # Every app container is done: the pod stops, sidecars too; they must not keep it alive.
        actions.kill_pod = True
        actions.init_containers_to_start = []
    return actions


def _succeeded(latest: ContainerStatus | None) -> bool:
    return latest is not None and latest.state == ContainerState.EXITED and latest.exit_code == 0


def _kill(actions: PodActions, container: ContainerStatus, reason: str, message: str, probe: str = "") -> None:
    actions.containers_to_kill[container.id] = ContainerToKill(container.id, container.name, reason, message, probe)


def _kill_containers_not_in_spec(pod: podutil.Pod, status: PodRuntimeStatus, actions: PodActions) -> None:
    known = {spec.get("name", "") for spec in podutil.all_containers(pod)}
    known.update(spec.get("name", "") for spec in podutil.ephemeral_containers(pod))
    for container in status.containers:
        if container.name not in known and container.state in (ContainerState.RUNNING, ContainerState.UNKNOWN):
            _kill(actions, container, REASON_NOT_IN_SPEC, f"Container {container.name} is not in the pod spec")
