"""A pod's API status (phase, conditions, container statuses) from its spec and runtime state.

Pure and deterministic: the clock and every probe or start-failure result come in as arguments, so
equal inputs give byte-identical output and the status hash can decide whether anything is written.
The rules follow the kubelet's generateAPIPodStatus, getPhase and status/generate.go.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from edgelet.api import podutil
from edgelet.api.kubetime import format_time
from edgelet.api.qos import qos_class
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState
from edgelet.kuberuntime.actions import has_any_regular_container_created, pod_sandbox_changed, should_restart
from edgelet.kuberuntime.termmessage import trim_pod_messages

PENDING = "Pending"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
TERMINAL_PHASES = (SUCCEEDED, FAILED)

RUNTIME_NAME = "containerd"  # the scheme of containerID, as the runtime reports its name

# Condition types the agent owns; every other condition on the pod (readiness gates, disruption) is kept.
POD_SCHEDULED = "PodScheduled"
POD_READY_TO_START_CONTAINERS = "PodReadyToStartContainers"
POD_INITIALIZED = "Initialized"
CONTAINERS_READY = "ContainersReady"
POD_READY = "Ready"
KUBELET_CONDITIONS = frozenset({
    POD_SCHEDULED, POD_READY_TO_START_CONTAINERS, POD_INITIALIZED, CONTAINERS_READY, POD_READY,
    "PodResizePending", "PodResizeInProgress",
})
DISRUPTION_TARGET = "DisruptionTarget"

# Waiting and condition reasons, spelled as the kubelet spells them.
CONTAINER_CREATING = "ContainerCreating"
POD_INITIALIZING = "PodInitializing"
STATUS_UNKNOWN = "ContainerStatusUnknown"
REASON_CONTAINERS_NOT_READY = "ContainersNotReady"
REASON_CONTAINERS_NOT_INITIALIZED = "ContainersNotInitialized"
REASON_READINESS_GATES_NOT_READY = "ReadinessGatesNotReady"
REASON_POD_COMPLETED = "PodCompleted"
REASON_POD_FAILED = "PodFailed"

_RUNNING_OR_UNKNOWN = (ContainerState.RUNNING, ContainerState.UNKNOWN)
_NOTHING: Mapping[str, Any] = MappingProxyType({})


def _time_field(key: str, nanos: int) -> dict[str, str]:
    """{key: time} from CRI nanoseconds; CRI's zero means "never", which the API leaves out."""
    return {key: format_time(nanos // 1_000_000_000)} if nanos > 0 else {}


def generate_pod_status(
    pod: podutil.Pod,
    runtime: PodRuntimeStatus,
    *,
    old_status: dict[str, Any] | None,
    now: float,
    waiting_reasons: Mapping[str, tuple[str, str]] = _NOTHING,
    readiness: Mapping[str, bool] = _NOTHING,
    started: Mapping[str, bool] = _NOTHING,
    host_ip: str = "",
    pod_failure: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The PodStatus dict for `pod`.

    `old_status` is the last status the agent produced (None: the pod's own `status` is used, as the
    kubelet does after a restart). `waiting_reasons` maps a container name to the (reason, message)
    of its last failed start or its back-off; `readiness` and `started` map names to readiness and
    startup probe results (missing: true when the container has no such probe). `pod_failure` marks
    the pod Failed with that (reason, message).
    """
    api_status = pod.get("status") or {}
    old = old_status if old_status is not None else api_status
    init_specs = podutil.init_containers(pod)
    app_specs = podutil.containers(pod)
    has_init = bool(init_specs)

    init_statuses = _container_statuses(
        pod, runtime, init_specs, old.get("initContainerStatuses"), True, has_init, waiting_reasons)
    app_statuses = _container_statuses(
        pod, runtime, app_specs, old.get("containerStatuses"), False, has_init, waiting_reasons)
    _apply_probe_results(init_specs, init_statuses, app_specs, app_statuses, readiness, started)
    ephemeral_specs = podutil.ephemeral_containers(pod)
    # Ephemeral containers are never restarted, so only a failed first start leaves them a waiting reason.
    ephemeral_statuses = _container_statuses(
        pod, runtime, ephemeral_specs, old.get("ephemeralContainerStatuses"), False, has_init,
        {name: reason for name, reason in waiting_reasons.items() if runtime.latest_container(name) is None})
    for ephemeral in ephemeral_statuses:
        ephemeral["started"] = "running" in ephemeral["state"]
    trim_pod_messages([*init_statuses, *app_statuses], len(init_specs) + len(app_specs))

    # A deleted pod whose containers all stopped is terminal: its containers will not run again.
    pod_is_terminal = podutil.deletion_requested(pod) and not any(
        c.state in _RUNNING_OR_UNKNOWN for c in runtime.containers)
    phase = get_phase(pod, init_statuses, app_statuses, pod_is_terminal=pod_is_terminal)
    reason = message = ""
    if pod_failure is not None:
        phase = FAILED
        reason, message = pod_failure
    else:
        # A pod never leaves a terminal phase, whatever its containers do afterwards.
        if phase not in TERMINAL_PHASES:
            if old.get("phase") in TERMINAL_PHASES:
                phase = old["phase"]
            elif api_status.get("phase") in TERMINAL_PHASES:
                phase = api_status["phase"]
        if phase == old.get("phase"):
            reason = old.get("reason") or api_status.get("reason") or ""
            message = old.get("message") or api_status.get("message") or ""
    if api_status.get("phase") in TERMINAL_PHASES:
        phase = api_status["phase"]

    status: dict[str, Any] = {
        "phase": phase,
        "conditions": _conditions(pod, runtime, old, api_status, init_statuses, app_statuses, phase, now),
        "startTime": old.get("startTime") or format_time(now),
        "qosClass": api_status.get("qosClass") or qos_class(pod),
        "containerStatuses": sorted(app_statuses, key=lambda s: s["name"]),
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    if ephemeral_statuses:
        status["ephemeralContainerStatuses"] = ephemeral_statuses
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    pod_ips = _pod_ips(pod, runtime, old, host_ip)
    if pod_ips:
        status["podIP"] = pod_ips[0]
        status["podIPs"] = [{"ip": ip} for ip in pod_ips]
    return status


def get_phase(
    pod: podutil.Pod,
    init_statuses: list[dict[str, Any]],
    container_statuses: list[dict[str, Any]],
    *,
    pod_is_terminal: bool = False,
) -> str:
    """The pod phase from its API container statuses, by the kubelet's getPhase rules."""
    by_name = {s.get("name"): s for s in [*init_statuses, *container_statuses]}
    restart_policy = podutil.restart_policy(pod)

    pending_init = failed_init = 0
    pending_sidecars = 0
    unknown = running = waiting = stopped = succeeded = 0
    for spec in podutil.init_containers(pod):
        status = by_name.get(spec.get("name"))
        state = (status or {}).get("state") or {}
        if podutil.is_sidecar(spec):
            # A stopped sidecar does not count for the phase; a running one keeps the pod Running.
            if status is None:
                unknown += 1
                pending_sidecars += 1
            elif "running" in state:
                running += 1
                pending_sidecars += not status.get("started")
            elif "waiting" in state and not _last_terminated(status):
                pending_sidecars += 1
                waiting += 1
            elif not state:
                pending_sidecars += 1
                unknown += 1
        elif "terminated" in state:
            failed_init += state["terminated"].get("exitCode", 0) != 0
        elif "waiting" in state and (last := _last_terminated(status)):
            failed_init += last.get("exitCode", 0) != 0
        else:
            pending_init += 1  # missing, running, or waiting for its first run

    for spec in podutil.containers(pod):
        status = by_name.get(spec.get("name"))
        state = (status or {}).get("state") or {}
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"].get("exitCode", 0) == 0
        elif "waiting" in state:
            if _last_terminated(status):
                stopped += 1
            else:
                waiting += 1
        else:
            unknown += 1

    if failed_init and restart_policy == "Never":
        return FAILED
    # Sidecars still starting hold the pod Pending, unless app containers ran already (after a reboot every
    # container is stopped and the new sandbox initializes again: the kubelet's workaround).
    if pending_init or (pending_sidecars and not stopped) or waiting:
        return PENDING
    if running and not unknown:
        return RUNNING
    if not running and stopped and not unknown:
        # Static pods stay out of terminal phases: the same manifest coming back has the same UID,
        # and a terminal phase would forbid it to run again.
        if pod_is_terminal and not podutil.is_static(pod):
            return SUCCEEDED if stopped == succeeded else FAILED
        if restart_policy == "Always":
            return RUNNING  # every container is on its way to a restart
        if stopped == succeeded:
            return SUCCEEDED
        if restart_policy == "Never":
            return FAILED
        return RUNNING  # OnFailure: the failed ones restart
    return PENDING


def _last_terminated(status: dict[str, Any] | None) -> dict[str, Any] | None:
    return ((status or {}).get("lastState") or {}).get("terminated")


# --- container statuses -----------------------------------------------------------------------


def _container_statuses(
    pod: podutil.Pod,
    runtime: PodRuntimeStatus,
    specs: list[dict[str, Any]],
    previous: list[dict[str, Any]] | None,
    is_init: bool,
    has_init: bool,
    waiting_reasons: Mapping[str, tuple[str, str]],
) -> list[dict[str, Any]]:
    """API statuses of `specs` in spec order, in the kubelet's convertToAPIContainerStatuses steps:
    defaults and what the last status knew, containers the runtime lost, what the runtime says,
    then waiting reasons for containers about to be started again."""
    old_by_name = {s.get("name") or "": s for s in previous or []}  # "": no container is nameless
    statuses = _defaults(specs, old_by_name, has_init)
    _mark_lost(pod, runtime, old_by_name, statuses)
    _apply_runtime(runtime, specs, old_by_name, statuses)
    _apply_waiting_reasons(pod, runtime, specs, is_init, waiting_reasons, statuses)
    return [statuses[spec.get("name", "")] for spec in specs]


def _defaults(
    specs: list[dict[str, Any]], old_by_name: dict[str, dict[str, Any]], has_init: bool
) -> dict[str, dict[str, Any]]:
    default_reason = POD_INITIALIZING if has_init else CONTAINER_CREATING
    statuses = {}
    for spec in specs:
        name = spec.get("name", "")
        status = {
            "name": name, "image": spec.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
            "started": False, "state": {"waiting": {"reason": default_reason}}, "lastState": {},
        }
        old = old_by_name.get(name)
        if old is not None:
            if "terminated" in (old.get("state") or {}):
                # The runtime may have lost the container since: what it last said still holds.
                status = copy.deepcopy(old)
                status.setdefault("lastState", {})
            else:
                status["restartCount"] = old.get("restartCount", 0)
                status["lastState"] = copy.deepcopy(old.get("lastState") or {})
        statuses[name] = status
    return statuses


def _mark_lost(
    pod: podutil.Pod,
    runtime: PodRuntimeStatus,
    old_by_name: dict[str, dict[str, Any]],
    statuses: dict[str, dict[str, Any]],
) -> None:
    """A container that was running and that the runtime no longer knows shows as stopped, not as
    waiting to start, or the pod would fall back to Pending."""
    in_runtime = {c.name for c in runtime.containers}
    for name, status in statuses.items():
        old = old_by_name.get(name)
        if name in in_runtime or old is None or "running" not in (old.get("state") or {}):
            continue
        if _last_terminated(status):
            continue
        status["lastState"] = {"terminated": {
            "exitCode": 137, "reason": STATUS_UNKNOWN,
            "message": "The container could not be located when the pod was deleted.  "
                       "The container used to be Running",
        }}
        if not podutil.deletion_requested(pod):
            status["restartCount"] = status.get("restartCount", 0) + 1


def _apply_runtime(
    runtime: PodRuntimeStatus,
    specs: list[dict[str, Any]],
    old_by_name: dict[str, dict[str, Any]],
    statuses: dict[str, dict[str, Any]],
) -> None:
    """The newest instance of each container gives its state, the one before its last state."""
    image_of = {spec.get("name", ""): spec.get("image", "") for spec in specs}
    seen: dict[str, int] = {}
    for container in sorted(runtime.containers, key=lambda c: c.created_at, reverse=True):
        name = container.name
        if name not in statuses or seen.get(name, 0) >= 2:
            continue
        converted = _convert(container, old_by_name.get(name), image_of[name])
        if name not in seen:
            statuses[name] = converted
        else:
            statuses[name]["lastState"] = converted["state"]
        seen[name] = seen.get(name, 0) + 1


def _apply_waiting_reasons(
    pod: podutil.Pod,
    runtime: PodRuntimeStatus,
    specs: list[dict[str, Any]],
    is_init: bool,
    waiting_reasons: Mapping[str, tuple[str, str]],
    statuses: dict[str, dict[str, Any]],
) -> None:
    regular_created = is_init and has_any_regular_container_created(pod, runtime)
    for spec in specs:
        name = spec.get("name", "")
        status = statuses[name]
        latest = runtime.latest_container(name)
        if is_init:
            if latest is not None and latest.state == ContainerState.EXITED and latest.exit_code == 0:
                continue  # done for good, or a sidecar that ended well: it shows how it ended until it runs again
            if latest is None and regular_created and "waiting" in status["state"]:
                # App containers exist, so this one once finished; the runtime just forgot it.
                status["state"] = {"terminated": {
                    "exitCode": 0, "reason": "Completed",
                    "message": "Unable to get init container status from container runtime and pod has "
                               "been initialized, treat it as exited normally",
                }}
                continue
        if not should_restart(pod, spec, latest) or name not in waiting_reasons:
            continue
        reason, message = waiting_reasons[name]
        if "terminated" in status["state"]:
            status["lastState"] = status["state"]
        status["state"] = {"waiting": _non_empty(reason=reason, message=message)}


def _convert(container: ContainerStatus, old: dict[str, Any] | None, spec_image: str) -> dict[str, Any]:
    container_id = f"{RUNTIME_NAME}://{container.id}"
    status: dict[str, Any] = {
        "name": container.name,
        "image": container.image or spec_image,
        "imageID": container.image_ref or container.image_id,
        "containerID": container_id,
        "restartCount": container.restart_count,
        "ready": False,
        "started": False,
        "lastState": {},
    }
    state = container.state
    if state == ContainerState.RUNNING:
        status["state"] = {"running": _time_field("startedAt", container.started_at)}
    elif state == ContainerState.EXITED:
        terminated = {
            "exitCode": container.exit_code,
            "reason": container.reason or ("Completed" if container.exit_code == 0 else "Error"),
            "containerID": container_id,
            **_time_field("startedAt", container.started_at),
            **_time_field("finishedAt", container.finished_at),
        }
        if container.message:
            terminated["message"] = container.message
        status["state"] = {"terminated": terminated}
    elif state == ContainerState.UNKNOWN and old is not None and "running" in (old.get("state") or {}):
        # It ran and is gone without a word: a crash, not a container that never started.
        status["state"] = {"terminated": {
            "exitCode": 137, "reason": STATUS_UNKNOWN,
            "message": "The container could not be located when the pod was terminated",
        }}
        status["restartCount"] = old.get("restartCount", 0) + 1
    else:
        status["state"] = {"waiting": {}}  # created but not started, or unknown: waiting to run
    return status


def _non_empty(**fields: str) -> dict[str, str]:
    return {key: value for key, value in fields.items() if value}


def _apply_probe_results(
    init_specs: list[dict[str, Any]],
    init_statuses: list[dict[str, Any]],
    app_specs: list[dict[str, Any]],
    app_statuses: list[dict[str, Any]],
    readiness: Mapping[str, bool],
    started: Mapping[str, bool],
) -> None:
    """Set `started` and `ready` as the kubelet's prober manager does."""
    for spec, status in zip(app_specs, app_statuses):
        name = status["name"]
        is_running = "running" in status["state"]
        status["started"] = is_running and bool(started.get(name, not spec.get("startupProbe")))
        status["ready"] = status["started"] and bool(readiness.get(name, not spec.get("readinessProbe")))
    for spec, status in zip(init_specs, init_statuses):
        name = status["name"]
        is_running = "running" in status["state"]
        if podutil.is_sidecar(spec):
            # A sidecar is judged like an app container: started once its startup probe passed, then ready.
            status["started"] = is_running and bool(started.get(name, not spec.get("startupProbe")))
            status["ready"] = status["started"] and bool(readiness.get(name, not spec.get("readinessProbe")))
            continue
        terminated = status["state"].get("terminated")
        status["started"] = is_running
        status["ready"] = terminated is not None and terminated.get("exitCode", 0) == 0


# --- conditions and addresses -----------------------------------------------------------------


def _conditions(
    pod: podutil.Pod,
    runtime: PodRuntimeStatus,
    old: dict[str, Any],
    api_status: dict[str, Any],
    init_statuses: list[dict[str, Any]],
    app_statuses: list[dict[str, Any]],
    phase: str,
    now: float,
) -> list[dict[str, Any]]:
    conditions = [
        copy.deepcopy(c) for c in api_status.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]
    # Disruption is recorded once, by eviction or shutdown; it is carried over, not recomputed.
    disruption = next((c for c in old.get("conditions") or [] if c.get("type") == DISRUPTION_TARGET), None)
    if disruption is not None:
        conditions = [c for c in conditions if c.get("type") != DISRUPTION_TARGET] + [copy.deepcopy(disruption)]

    sandbox_changed, _, _ = pod_sandbox_changed(pod, runtime)
    containers_ready = _containers_ready(pod, init_statuses, app_statuses, phase)
    owned = [
        _condition(POD_READY_TO_START_CONTAINERS, not sandbox_changed),
        _initialized(pod, init_statuses, app_statuses, phase),
        _ready(pod, conditions, containers_ready),
        containers_ready,
        _condition(POD_SCHEDULED, True),
    ]
    old_by_type = {c.get("type"): c for c in old.get("conditions") or []}
    for condition in owned:
        previous = old_by_type.get(condition["type"])
        if previous is not None and previous.get("status") == condition["status"] and previous.get(
                "lastTransitionTime"):
            condition["lastTransitionTime"] = previous["lastTransitionTime"]
        else:
            condition["lastTransitionTime"] = format_time(now)
    return conditions + owned


def _condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", **_non_empty(reason=reason, message=message)}


def _names(names: Iterable[str]) -> str:
    """A name list as the kubelet prints it (Go's %s of a []string): [a b]."""
    return "[" + " ".join(names) + "]"


def _containers_ready(pod: podutil.Pod, init_statuses: list[dict[str, Any]], app_statuses: list[dict[str, Any]],
                      phase: str) -> dict[str, Any]:
    if phase == SUCCEEDED:
        return _condition(CONTAINERS_READY, False, REASON_POD_COMPLETED)
    if phase == FAILED:
        return _condition(CONTAINERS_READY, False, REASON_POD_FAILED)
    ready = {s.get("name"): s.get("ready") for s in [*init_statuses, *app_statuses]}
    counted = [c for c in podutil.init_containers(pod) if podutil.is_sidecar(c)] + podutil.containers(pod)
    unready = [c.get("name", "") for c in counted if not ready.get(c.get("name", ""))]
    if unready:
        return _condition(CONTAINERS_READY, False, REASON_CONTAINERS_NOT_READY,
                          f"containers with unready status: {_names(unready)}")
    return _condition(CONTAINERS_READY, True)


def _ready(pod: podutil.Pod, conditions: list[dict[str, Any]], containers_ready: dict[str, Any]) -> dict[str, Any]:
    if containers_ready["status"] != "True":
        return {**containers_ready, "type": POD_READY}
    by_type = {c.get("type"): c for c in conditions}
    problems = []
    for gate in podutil.spec(pod).get("readinessGates") or []:
        kind = gate.get("conditionType", "")
        condition = by_type.get(kind)
        if condition is None:
            problems.append(f'corresponding condition of pod readiness gate "{kind}" does not exist.')
        elif condition.get("status") != "True":
            problems.append(f'the status of pod readiness gate "{kind}" is not "True", but {condition.get("status")}')
    if problems:
        return _condition(POD_READY, False, REASON_READINESS_GATES_NOT_READY, ", ".join(problems))
    return _condition(POD_READY, True)


def readiness_needs_reconcile(pod: podutil.Pod) -> bool:
    """Whether the Ready condition in the pod's API status is not what its readiness gates and containers
    make it: someone set a gate's condition (the kubelet's NeedToReconcilePodReadiness), so the pod is synced."""
    if not podutil.spec(pod).get("readinessGates"):
        return False
    status = pod.get("status") or {}
    current = next((c for c in status.get("conditions") or [] if c.get("type") == POD_READY), None)
    if current is None:
        return False
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]
    wanted = _ready(pod, conditions, _containers_ready(
        pod, status.get("initContainerStatuses") or [], status.get("containerStatuses") or [],
        status.get("phase") or ""))
    return (current.get("status"), current.get("message", "")) != (wanted["status"], wanted.get("message", ""))


def _initialized(
    pod: podutil.Pod, init_statuses: list[dict[str, Any]], app_statuses: list[dict[str, Any]], phase: str
) -> dict[str, Any]:
    if phase == SUCCEEDED:
        return _condition(POD_INITIALIZED, True, REASON_POD_COMPLETED)
    # An app container that ran proves initialization finished, even if init containers restart.
    if any("running" in s["state"] or "terminated" in s["state"] for s in app_statuses):
        return _condition(POD_INITIALIZED, True)
    sidecars = {c.get("name", "") for c in podutil.init_containers(pod) if podutil.is_sidecar(c)}
    incomplete = [s["name"] for s in init_statuses if not (s["started"] if s["name"] in sidecars else s["ready"])]
    if incomplete:
        return _condition(POD_INITIALIZED, False, REASON_CONTAINERS_NOT_INITIALIZED,
                          f"containers with incomplete status: {_names(incomplete)}")
    return _condition(POD_INITIALIZED, True)


def _pod_ips(pod: podutil.Pod, runtime: PodRuntimeStatus, old: dict[str, Any], host_ip: str) -> list[str]:
    """Host network pods have the node's address. Others have their newest sandbox's while it is
    ready; once no sandbox is, the last known addresses stay, so a finished pod keeps its IP."""
    old_ips = [entry.get("ip", "") for entry in old.get("podIPs") or [] if entry.get("ip")]
    if not old_ips and old.get("podIP"):
        old_ips = [old["podIP"]]
    if podutil.host_network(pod):
        return [host_ip] if host_ip else old_ips
    sandboxes = runtime.sandboxes
    if sandboxes and sandboxes[0].state == SandboxState.READY and sandboxes[0].ip:
        return [sandboxes[0].ip]
    if any(s.state == SandboxState.READY for s in sandboxes):
        return []
    return old_ips
