"""What a sync must do to bring a pod's runtime state to its spec: a pure decision over plain data.

`compute_pod_actions` mirrors the kubelet's computePodActions; the manager carries the result out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from edgelet import podutil
from edgelet.kuberuntime.types import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState

Hasher = Callable[[str, str], str]

# Why a container is killed; the manager puts these into events and logs.
REASON_CHANGED = "Changed"
REASON_UNHEALTHY = "Unhealthy"
REASON_UNKNOWN_STATE = "Unknown"
REASON_NOT_IN_SPEC = "NotInSpec"


@dataclass(slots=True)
class ContainerToKill:
    container_id: str
    name: str
    reason: str
    message: str


@dataclass(slots=True)
class PodActions:
    """The plan for one sync. With `kill_pod`, every container and sandbox of the pod is stopped first
    and `containers_to_kill` is moot. With `create_sandbox`, the manager also removes the pod's old
    init containers before starting `next_init_container`, as the kubelet purges them; otherwise the
    next sync would take them for a finished initialization."""

    kill_pod: bool
    create_sandbox: bool
    sandbox_id: str  # the newest sandbox when it is ready, "" if none is
    attempt: int  # attempt number for a new sandbox, else the highest existing one
    next_init_container: dict[str, Any] | None = None
    init_failed: bool = False  # an init container failed under restartPolicy Never: the pod fails
    containers_to_start: list[int] = field(default_factory=list)  # indexes into spec.containers
    containers_to_kill: dict[str, ContainerToKill] = field(default_factory=dict)  # by container id

    def no_change(self) -> bool:
        return not (
            self.kill_pod
            or self.create_sandbox
            or self.next_init_container is not None
            or self.containers_to_start
            or self.containers_to_kill
        )


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
    """Whether a (not running) app container is to be started again, given its newest instance."""
    if podutil.deletion_requested(pod):
        return False
    if latest is None:
        return True  # never ran, or every instance was garbage collected
    if latest.state == ContainerState.RUNNING:
        return False
    if latest.state in (ContainerState.UNKNOWN, ContainerState.CREATED):
        return True  # it may never have run: try again
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


def next_init_container(
    pod: podutil.Pod, status: PodRuntimeStatus
) -> tuple[ContainerStatus | None, dict[str, Any] | None, bool]:
    """(status of the failed init container, init container to run now, initialization done).

    The failed status is only given when an init container failed; `next` then names that container.
    `next` is None and done False while an init container is still running.
    """
    specs = podutil.init_containers(pod)
    if not specs:
        return None, None, True
    # A running app container proves initialization finished, even if the init containers were
    # since removed from the runtime; running them again would be wrong.
    for spec in podutil.containers(pod):
        latest = status.latest_container(spec.get("name", ""))
        if latest is not None and latest.state == ContainerState.RUNNING:
            return None, None, True
    for spec in reversed(specs):
        latest = status.latest_container(spec.get("name", ""))
        if latest is not None and init_container_failed(latest):
            return latest, spec, False
    for index in range(len(specs) - 1, -1, -1):
        latest = status.latest_container(specs[index].get("name", ""))
        if latest is None:
            continue
        if latest.state == ContainerState.RUNNING:
            return None, None, False
        if latest.state == ContainerState.EXITED:
            if index == len(specs) - 1:
                return None, None, True
            return None, specs[index + 1], False
    return None, specs[0], False


def has_any_regular_container_created(pod: podutil.Pod, status: PodRuntimeStatus) -> bool:
    return any(status.latest_container(spec.get("name", "")) is not None for spec in podutil.containers(pod))


def compute_pod_actions(
    pod: podutil.Pod,
    status: PodRuntimeStatus,
    *,
    liveness_failed: Collection[str] = (),
    startup_failed: Collection[str] = (),
    hasher: Hasher | None = None,
) -> PodActions:
    """Decide this sync's actions. `liveness_failed` and `startup_failed` hold container ids whose
    probe failed (results belong to one container instance, as the kubelet's prober results do);
    `hasher(name, image)` gives the expected `io.kubernetes.container.hash`. Restart backoff is left
    to the caller: `containers_to_start` lists every container that should run again."""
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
        if not to_start:
            _, _, init_done = next_init_container(pod, status)
            if init_done or has_any_regular_container_created(pod, status):
                actions.create_sandbox = False
                return actions
        init_specs = podutil.init_containers(pod)
        if init_specs:
            actions.next_init_container = init_specs[0]
            return actions
        actions.containers_to_start = to_start
        return actions

    _kill_containers_not_in_spec(pod, status, actions)

    failed_init, next_init, init_done = next_init_container(pod, status)
    if not init_done:
        if next_init is not None:
            if failed_init is not None and restart_policy == "Never":
                actions.kill_pod = True
                actions.init_failed = True
            else:
                if failed_init is not None and failed_init.state == ContainerState.UNKNOWN:
                    _kill(actions, failed_init, REASON_UNKNOWN_STATE,
                          "Init container is in an unknown state, killing it before restart")
                actions.next_init_container = next_init
        return actions

    hash_of = hasher or default_hasher()
    keep = 0
    for index, spec in enumerate(specs):
        name = spec.get("name", "")
        latest = status.latest_container(name)
        if latest is None or latest.state != ContainerState.RUNNING:
            if should_restart(pod, spec, latest):
                actions.containers_to_start.append(index)
                if latest is not None and latest.state == ContainerState.UNKNOWN:
                    # It may still be running; never let two instances of one container run.
                    _kill(actions, latest, REASON_UNKNOWN_STATE,
                          "Container is in an unknown state, killing it before restart")
            continue

        restart = restart_policy != "Never"
        if latest.hash != hash_of(name, spec.get("image", "")):
            reason, message = REASON_CHANGED, f"Container {name} definition changed"
            restart = True  # a new definition runs whatever the restart policy says
        elif latest.id in liveness_failed:
            reason, message = REASON_UNHEALTHY, f"Container {name} failed liveness probe"
        elif latest.id in startup_failed:
            reason, message = REASON_UNHEALTHY, f"Container {name} failed startup probe"
        else:
            keep += 1
            continue
        if restart:
            message += ", will be restarted"
            actions.containers_to_start.append(index)
        _kill(actions, latest, reason, message)

    if keep == 0 and not actions.containers_to_start:
        actions.kill_pod = True
    return actions


def _succeeded(latest: ContainerStatus | None) -> bool:
    return latest is not None and latest.state == ContainerState.EXITED and latest.exit_code == 0


def _kill(actions: PodActions, container: ContainerStatus, reason: str, message: str) -> None:
    actions.containers_to_kill[container.id] = ContainerToKill(container.id, container.name, reason, message)


def _kill_containers_not_in_spec(pod: podutil.Pod, status: PodRuntimeStatus, actions: PodActions) -> None:
    known = {spec.get("name", "") for spec in podutil.all_containers(pod)}
    for container in status.containers:
        if container.name not in known and container.state in (ContainerState.RUNNING, ContainerState.UNKNOWN):
            _kill(actions, container, REASON_NOT_IN_SPEC, f"Container {container.name} is not in the pod spec")
