"""generate_pod_status and get_phase against the kubelet's rules, as tables and worked examples."""

import copy
import itertools

import orjson
import pytest

from edgelet.api.kubetime import format_time
from edgelet.container.runtime import (
    ContainerState,
    ContainerStatus,
    PodRuntimeStatus,
    SandboxState,
    SandboxStatus,
)
from edgelet.status.generate import generate_pod_status, get_phase, readiness_needs_reconcile
from tests.helpers import make_pod

RUNNING, EXITED, CREATED, UNKNOWN = (
    ContainerState.RUNNING, ContainerState.EXITED, ContainerState.CREATED, ContainerState.UNKNOWN)

T0 = 1767225600.0  # 2026-01-01T00:00:00Z
T0_TEXT = "2026-01-01T00:00:00Z"
T1 = T0 + 90
T1_TEXT = "2026-01-01T00:01:30Z"
SECOND = 1_000_000_000


def sandbox(state=SandboxState.READY, ip="10.1.0.7", id="sb1"):
    return SandboxStatus(id=id, name="web", namespace="default", uid="uid-1", attempt=0, state=state,
                         created_at=1, ip=ip)


_created = itertools.count(1000)


def ctr(name, state=RUNNING, exit_code=0, id=None, restarts=0, reason="", message="", started=T0 - 60,
        finished=T0 - 30):
    return ContainerStatus(
        id=id or f"{name}{next(_created)}", name=name, sandbox_id="sb1", state=state,
        created_at=int(started * SECOND) - 1,
        started_at=int(started * SECOND) if state != CREATED else 0,
        finished_at=int(finished * SECOND) if state == EXITED else 0,
        exit_code=exit_code, reason=reason, message=message, image=f"docker.io/library/img-{name}:1",
        image_ref=f"docker.io/library/img-{name}@sha256:abc", restart_count=restarts,
    )


def newest_first(*containers):
    """Give the containers descending creation times, as the runtime lists them."""
    for offset, c in enumerate(containers):
        c.created_at = 10**20 - offset
    return list(containers)


def runtime(*containers, sandboxes=None):
    return PodRuntimeStatus(uid="uid-1", name="web", namespace="default",
                            sandboxes=[sandbox()] if sandboxes is None else sandboxes,
                            containers=list(containers))


def generate(pod, status, old_status=None, now=T0, **kwargs):
    return generate_pod_status(pod, status, old_status=old_status, now=now, **kwargs)


def conditions(status):
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", "")) for c in status["conditions"]}


def container_status(status, name, init=False):
    key = "initContainerStatuses" if init else "containerStatuses"
    return next(s for s in status[key] if s["name"] == name)


# --- get_phase ---------------------------------------------------------------------------------

def api(name, state, last=None):
    return {"name": name, "state": state, "lastState": last or {}}


def running(name):
    return api(name, {"running": {"startedAt": T0_TEXT}})


def done(name, code):
    return api(name, {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}})


def waiting(name, reason="ContainerCreating", last_code=None):
    last = None if last_code is None else {"terminated": {"exitCode": last_code}}
    return api(name, {"waiting": {"reason": reason}}, last)


PHASES = [
    # containers' states              Always     OnFailure  Never
    ([running("a"), running("b")],      ("Running", "Running", "Running")),
    ([running("a"), waiting("b")],      ("Pending", "Pending", "Pending")),
    ([waiting("a"), waiting("b")],      ("Pending", "Pending", "Pending")),
    ([running("a"), done("b", 0)],      ("Running", "Running", "Running")),
    ([running("a"), done("b", 1)],      ("Running", "Running", "Running")),
    ([done("a", 0), done("b", 0)],      ("Running", "Succeeded", "Succeeded")),
    ([done("a", 0), done("b", 1)],      ("Running", "Running", "Failed")),
    ([done("a", 2), done("b", 137)],    ("Running", "Running", "Failed")),
    # CrashLoopBackOff: waiting with a last termination counts as stopped, never as succeeded
    ([waiting("a", "CrashLoopBackOff", 1)], ("Running", "Running", "Failed")),
    ([waiting("a", "CrashLoopBackOff", 0)], ("Running", "Running", "Failed")),
    ([done("a", 0), waiting("b", "CrashLoopBackOff", 1)], ("Running", "Running", "Failed")),
    ([running("a"), waiting("b", "CrashLoopBackOff", 1)], ("Running", "Running", "Running")),
    ([api("a", {})],                    ("Pending", "Pending", "Pending")),
]


@pytest.mark.parametrize(
    ("statuses", "policy", "expected"),
    [(s, p, row[i]) for s, row in PHASES for i, p in enumerate(("Always", "OnFailure", "Never"))],
)
def test_get_phase_containers(statuses, policy, expected):
    pod = make_pod([s["name"] for s in statuses], policy=policy)
    assert get_phase(pod, [], statuses) == expected


INIT_PHASES = [
    # init states, app states -> Always, OnFailure, Never
    ([running("i1"), waiting("i2", "PodInitializing")], [waiting("a", "PodInitializing")],
     ("Pending", "Pending", "Pending")),
    ([done("i1", 0), waiting("i2", "PodInitializing")], [waiting("a", "PodInitializing")],
     ("Pending", "Pending", "Pending")),
    ([done("i1", 1), waiting("i2", "PodInitializing")], [waiting("a", "PodInitializing")],
     ("Pending", "Pending", "Failed")),
    ([waiting("i1", "CrashLoopBackOff", 1), waiting("i2")], [waiting("a", "PodInitializing")],
     ("Pending", "Pending", "Failed")),
    ([done("i1", 0), done("i2", 0)], [waiting("a", "PodInitializing")], ("Pending", "Pending", "Pending")),
    ([done("i1", 0), done("i2", 0)], [running("a")], ("Running", "Running", "Running")),
    ([done("i1", 0), done("i2", 0)], [done("a", 0)], ("Running", "Succeeded", "Succeeded")),
]


@pytest.mark.parametrize(
    ("init_statuses", "statuses", "policy", "expected"),
    [(i, s, p, row[n]) for i, s, row in INIT_PHASES for n, p in enumerate(("Always", "OnFailure", "Never"))],
)
def test_get_phase_init_containers(init_statuses, statuses, policy, expected):
    pod = make_pod([s["name"] for s in statuses], init=[s["name"] for s in init_statuses], policy=policy)
    assert get_phase(pod, init_statuses, statuses) == expected


@pytest.mark.parametrize(
    ("statuses", "static", "expected"),
    [
        ([done("a", 0), done("b", 0)], False, "Succeeded"),
        ([done("a", 0), done("b", 137)], False, "Failed"),
        ([waiting("a", "CrashLoopBackOff", 1)], False, "Failed"),
        ([done("a", 0), done("b", 0)], True, "Running"),  # static pods stay restartable
        ([running("a")], False, "Running"),
    ],
)
def test_get_phase_terminal_pod(statuses, static, expected):
    pod = make_pod([s["name"] for s in statuses], static=static)  # restartPolicy Always
    assert get_phase(pod, [], statuses, pod_is_terminal=True) == expected


# --- worked examples ---------------------------------------------------------------------------

def test_new_pod_before_anything_runs():
    status = generate(make_pod(("b", "a")), runtime(sandboxes=[]))
    assert status == {
        "phase": "Pending",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": T0_TEXT},
            {"type": "Initialized", "status": "True", "lastTransitionTime": T0_TEXT},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [b a]", "lastTransitionTime": T0_TEXT},
            {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [b a]", "lastTransitionTime": T0_TEXT},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0_TEXT},
        ],
        "startTime": T0_TEXT,
        "qosClass": "BestEffort",
        "containerStatuses": [  # sorted by name, as the kubelet sorts them
            {"name": "a", "image": "img-a", "imageID": "", "ready": False, "restartCount": 0, "started": False,
             "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {}},
            {"name": "b", "image": "img-b", "imageID": "", "ready": False, "restartCount": 0, "started": False,
             "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {}},
        ],
    }


def test_running_pod():
    a = ctr("a", id="abc", restarts=2)
    status = generate(make_pod(("a",)), runtime(a), host_ip="192.168.1.10")
    assert status["phase"] == "Running"
    assert container_status(status, "a") == {
        "name": "a", "image": "docker.io/library/img-a:1", "imageID": "docker.io/library/img-a@sha256:abc",
        "containerID": "containerd://abc", "restartCount": 2, "ready": True, "started": True,
        "state": {"running": {"startedAt": "2025-12-31T23:59:00Z"}}, "lastState": {},
    }
    assert conditions(status) == {
        "PodReadyToStartContainers": ("True", "", ""), "Initialized": ("True", "", ""),
        "Ready": ("True", "", ""), "ContainersReady": ("True", "", ""), "PodScheduled": ("True", "", ""),
    }
    assert (status["hostIP"], status["hostIPs"]) == ("192.168.1.10", [{"ip": "192.168.1.10"}])
    assert (status["podIP"], status["podIPs"]) == ("10.1.0.7", [{"ip": "10.1.0.7"}])


@pytest.mark.parametrize(
    ("policy", "code", "reason", "phase", "shown_reason", "condition_reason"),
    [
        ("Never", 0, "", "Succeeded", "Completed", "PodCompleted"),
        ("OnFailure", 0, "", "Succeeded", "Completed", "PodCompleted"),
        ("Never", 1, "", "Failed", "Error", "PodFailed"),
        ("Never", 137, "OOMKilled", "Failed", "OOMKilled", "PodFailed"),
    ],
)
def test_finished_pod(policy, code, reason, phase, shown_reason, condition_reason):
    a = ctr("a", EXITED, code, id="abc", reason=reason, message="bye")
    status = generate(make_pod(("a",), policy=policy), runtime(a, sandboxes=[sandbox(SandboxState.NOTREADY)]))
    assert status["phase"] == phase
    assert container_status(status, "a")["state"] == {"terminated": {
        "exitCode": code, "reason": shown_reason, "message": "bye", "containerID": "containerd://abc",
        "startedAt": "2025-12-31T23:59:00Z", "finishedAt": "2025-12-31T23:59:30Z",
    }}
    assert conditions(status)["ContainersReady"] == ("False", condition_reason, "")
    assert conditions(status)["Ready"] == ("False", condition_reason, "")
    assert conditions(status)["PodReadyToStartContainers"] == ("False", "", "")
    expected_initialized = ("True", "PodCompleted", "") if phase == "Succeeded" else ("True", "", "")
    assert conditions(status)["Initialized"] == expected_initialized


def test_crash_loop_shows_waiting_with_the_last_termination():
    newest, older = newest_first(ctr("a", EXITED, 1, id="n", restarts=3), ctr("a", EXITED, 1, id="o", restarts=2))
    status = generate(make_pod(("a",)), runtime(newest, older), waiting_reasons={
        "a": ("CrashLoopBackOff", "back-off 40s restarting failed container=a pod=web_default(uid-1)")})
    shown = container_status(status, "a")
    assert shown["state"] == {"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=a pod=web_default(uid-1)"}}
    assert shown["lastState"]["terminated"]["containerID"] == "containerd://n"
    assert (shown["restartCount"], shown["ready"], shown["started"]) == (3, False, False)
    assert status["phase"] == "Running"


def test_previous_instance_becomes_last_state():
    newest, older = newest_first(ctr("a", RUNNING, id="n", restarts=1), ctr("a", EXITED, 2, id="o"))
    shown = container_status(generate(make_pod(("a",)), runtime(older, newest)), "a")  # order given does not matter
    assert shown["containerID"] == "containerd://n"
    assert shown["lastState"]["terminated"]["exitCode"] == 2
    assert shown["lastState"]["terminated"]["containerID"] == "containerd://o"


@pytest.mark.parametrize(
    ("policy", "instance", "reason", "expected_state"),
    [
        ("Always", None, ("ErrImagePull", "pull failed"), {"waiting": {"reason": "ErrImagePull",
                                                                       "message": "pull failed"}}),
        ("Always", None, ("ImagePullBackOff", ""), {"waiting": {"reason": "ImagePullBackOff"}}),
        ("Never", None, ("CreateContainerConfigError", "no such secret"),
         {"waiting": {"reason": "CreateContainerConfigError", "message": "no such secret"}}),
        ("Always", None, None, {"waiting": {"reason": "ContainerCreating"}}),
        ("Always", CREATED, None, {"waiting": {}}),
        ("Always", RUNNING, ("CrashLoopBackOff", "stale"), {"running": {"startedAt": "2025-12-31T23:59:00Z"}}),
        ("Never", EXITED, ("CrashLoopBackOff", "stale"), "terminated"),
        ("OnFailure", EXITED, ("CrashLoopBackOff", "stale"), "terminated"),  # exit 0: no restart pending
    ],
)
def test_waiting_reasons(policy, instance, reason, expected_state):
    containers = [] if instance is None else [ctr("a", instance, 0)]
    shown = container_status(generate(make_pod(("a",), policy=policy), runtime(*containers),
                                      waiting_reasons={"a": reason} if reason else {}), "a")
    if expected_state == "terminated":
        assert list(shown["state"]) == ["terminated"]
    else:
        assert shown["state"] == expected_state


@pytest.mark.parametrize(
    ("probes", "readiness", "started", "expected"),
    [
        ((), {}, {}, (True, True)),
        (("readiness",), {}, {}, (False, True)),
        (("readiness",), {"a": False}, {}, (False, True)),
        (("readiness",), {"a": True}, {}, (True, True)),
        (("startup",), {}, {}, (False, False)),
        (("startup",), {}, {"a": True}, (True, True)),
        (("startup", "readiness"), {"a": True}, {"a": False}, (False, False)),
        (("startup", "readiness"), {"a": True}, {"a": True}, (True, True)),
    ],
)
def test_probe_results_set_ready_and_started(probes, readiness, started, expected):
    status = generate(make_pod(("a",), probes={"a": probes}), runtime(ctr("a")), readiness=readiness,
                      started=started)
    shown = container_status(status, "a")
    assert (shown["ready"], shown["started"]) == expected
    assert conditions(status)["Ready"][0] == ("True" if expected[0] else "False")


def test_init_container_running():
    status = generate(make_pod(("a",), init=("i1", "i2")), runtime(ctr("i1")))
    assert status["phase"] == "Pending"
    assert [s["state"] for s in status["initContainerStatuses"]] == [
        {"running": {"startedAt": "2025-12-31T23:59:00Z"}}, {"waiting": {"reason": "PodInitializing"}}]
    assert [s["name"] for s in status["initContainerStatuses"]] == ["i1", "i2"]
    assert container_status(status, "a")["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert container_status(status, "i1", init=True)["started"] is True
    assert conditions(status)["Initialized"] == (
        "False", "ContainersNotInitialized", "containers with incomplete status: [i1 i2]")


def test_init_containers_done():
    status = generate(make_pod(("a",), init=("i1",)), runtime(ctr("a"), ctr("i1", EXITED, 0)))
    init = container_status(status, "i1", init=True)
    assert (init["state"]["terminated"]["reason"], init["ready"], init["started"]) == ("Completed", True, False)
    assert conditions(status)["Initialized"] == ("True", "", "")
    assert status["phase"] == "Running"


def test_init_container_failure_under_never_fails_the_pod():
    status = generate(make_pod(("a",), init=("i1",), policy="Never"), runtime(ctr("i1", EXITED, 3)))
    assert status["phase"] == "Failed"
    assert conditions(status)["ContainersReady"] == ("False", "PodFailed", "")


def test_init_container_backoff_keeps_the_pod_pending():
    status = generate(make_pod(("a",), init=("i1",)), runtime(ctr("i1", EXITED, 3)),
                      waiting_reasons={"i1": ("CrashLoopBackOff", "back-off 10s")})
    init = container_status(status, "i1", init=True)
    assert init["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    assert init["lastState"]["terminated"]["exitCode"] == 3
    assert status["phase"] == "Pending"


def test_init_container_lost_after_initialization_counts_as_completed():
    status = generate(make_pod(("a",), init=("i1",)), runtime(ctr("a")))
    init = container_status(status, "i1", init=True)
    assert init["state"]["terminated"]["reason"] == "Completed"
    assert init["state"]["terminated"]["exitCode"] == 0
    assert init["ready"] is True


# --- native sidecars --------------------------------------------------------------------------

def started_sidecar(name):
    return {**running(name), "started": True}


SIDECAR_PHASES = [
    # sidecar states, app states -> Always, OnFailure, Never
    ([waiting("s", "PodInitializing")], [waiting("a", "PodInitializing")], ("Pending", "Pending", "Pending")),
    ([running("s")], [waiting("a", "PodInitializing")], ("Pending", "Pending", "Pending")),  # not started yet
    ([started_sidecar("s")], [running("a")], ("Running", "Running", "Running")),
    # the sidecar still runs after the apps finished: the pod is Running until it is stopped
    ([started_sidecar("s")], [done("a", 0)], ("Running", "Running", "Running")),
    # a stopped sidecar does not count: the apps decide
    ([done("s", 137)], [done("a", 0)], ("Running", "Succeeded", "Succeeded")),
    ([done("s", 0)], [done("a", 1)], ("Running", "Running", "Failed")),
    ([waiting("s", "CrashLoopBackOff", 1)], [running("a")], ("Running", "Running", "Running")),
    ([waiting("s", "CrashLoopBackOff", 1)], [done("a", 0)], ("Running", "Succeeded", "Succeeded")),
    # after a reboot: everything stopped, the sidecar waits to start again; app containers ran before
    ([waiting("s", "PodInitializing")], [done("a", 1)], ("Pending", "Pending", "Pending")),
]


@pytest.mark.parametrize(
    ("init_statuses", "statuses", "policy", "expected"),
    [(i, s, p, row[n]) for i, s, row in SIDECAR_PHASES for n, p in enumerate(("Always", "OnFailure", "Never"))],
)
def test_get_phase_with_sidecars(init_statuses, statuses, policy, expected):
    pod = make_pod([s["name"] for s in statuses], init=[s["name"] for s in init_statuses], policy=policy,
                   sidecars=[s["name"] for s in init_statuses])
    assert get_phase(pod, init_statuses, statuses) == expected


def test_static_pod_with_sidecar_succeeds_once_everything_stopped():
    # A static pod's manifest is gone only when the file is: its finished run is still Succeeded.
    pod = make_pod(("a",), init=("s",), sidecars=("s",), policy="Never", static=True)
    status = generate(pod, runtime(ctr("s", EXITED, 137), ctr("a", EXITED, 0)))
    assert status["phase"] == "Succeeded"
    assert conditions(status)["ContainersReady"] == ("False", "PodCompleted", "")


def test_sidecar_statuses_started_ready_and_restarts():
    pod = make_pod(("a",), init=("i1", "s"), sidecars=("s",), probes={"s": ("readiness", "startup")})
    status = generate(pod, runtime(ctr("a"), ctr("s", restarts=2), ctr("i1", EXITED, 0)),
                      readiness={"s": True, "a": True}, started={"s": True})
    sidecar = container_status(status, "s", init=True)
    assert (sidecar["started"], sidecar["ready"], sidecar["restartCount"]) == (True, True, 2)
    assert "running" in sidecar["state"]
    assert [s["name"] for s in status["initContainerStatuses"]] == ["i1", "s"]
    assert (status["phase"], conditions(status)["Ready"][0], conditions(status)["Initialized"][0]) == (
        "Running", "True", "True")


def test_unready_sidecar_makes_the_pod_unready():
    pod = make_pod(("a",), init=("s",), sidecars=("s",), probes={"s": ("readiness",)})
    status = generate(pod, runtime(ctr("a"), ctr("s")), readiness={"s": False})
    assert container_status(status, "s", init=True)["ready"] is False
    assert conditions(status)["ContainersReady"] == ("False", "ContainersNotReady",
                                                     "containers with unready status: [s]")
    assert conditions(status)["Ready"][0] == "False"


def test_sidecar_not_started_holds_initialization():
    pod = make_pod(("a",), init=("s",), sidecars=("s",), probes={"s": ("startup",)})
    status = generate(pod, runtime(ctr("s")), started={"s": False})
    assert container_status(status, "s", init=True)["started"] is False
    assert conditions(status)["Initialized"] == ("False", "ContainersNotInitialized",
                                                 "containers with incomplete status: [s]")
    assert status["phase"] == "Pending"
    status = generate(pod, runtime(ctr("s")), started={"s": True})
    assert conditions(status)["Initialized"] == ("True", "", "")


@pytest.mark.parametrize("policy", ("Always", "OnFailure", "Never"))
def test_sidecar_in_crash_loop_shows_waiting_whatever_the_policy(policy):
    pod = make_pod(("a",), init=("s",), sidecars=("s",), policy=policy)
    status = generate(pod, runtime(ctr("a"), ctr("s", EXITED, 1, restarts=3)),
                      waiting_reasons={"s": ("CrashLoopBackOff", "back-off 20s")})
    sidecar = container_status(status, "s", init=True)
    assert sidecar["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}}
    assert (sidecar["lastState"]["terminated"]["exitCode"], sidecar["restartCount"]) == (1, 3)
    assert status["phase"] == "Running"


# --- ephemeral containers ----------------------------------------------------------------------

def test_ephemeral_container_statuses():
    pod = make_pod(("a",), ephemeral=("debug", "later"))
    status = generate(pod, runtime(ctr("a"), ctr("debug")), waiting_reasons={"later": ("ErrImagePull", "no")})
    debug, later = status["ephemeralContainerStatuses"]
    assert (debug["name"], "running" in debug["state"], debug["ready"]) == ("debug", True, False)
    assert later["state"] == {"waiting": {"reason": "ErrImagePull", "message": "no"}}
    assert conditions(status)["Ready"][0] == "True"  # ephemeral containers never count for readiness


def test_exited_ephemeral_container_stays_terminated():
    pod = make_pod(("a",), ephemeral=("debug",))
    status = generate(pod, runtime(ctr("a"), ctr("debug", EXITED, 0)),
                      waiting_reasons={"debug": ("CrashLoopBackOff", "stale")})
    assert status["ephemeralContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert "ephemeralContainerStatuses" not in generate(make_pod(("a",)), runtime(ctr("a")))


# --- transitions and memory of the previous status ---------------------------------------------

def test_transition_times_kept_while_status_holds():
    pod, rt = make_pod(("a",)), runtime(ctr("a"))
    first = generate(pod, rt, now=T0)
    same = generate(pod, rt, old_status=first, now=T1)
    assert same == first  # nothing changed, so nothing moved, not even the times
    not_ready = generate(make_pod(("a",), probes={"a": ("readiness",)}), rt, old_status=first, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in not_ready["conditions"]}
    assert times == {"PodReadyToStartContainers": T0_TEXT, "Initialized": T0_TEXT, "Ready": T1_TEXT,
                     "ContainersReady": T1_TEXT, "PodScheduled": T0_TEXT}
    assert not_ready["startTime"] == T0_TEXT


def test_without_old_status_the_pods_own_status_is_the_base():
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-06-01T10:00:00Z"}
    pod = make_pod(("a",), status={"phase": "Pending", "conditions": [scheduled], "startTime": "2025-06-01T10:00:01Z",
                                   "qosClass": "Burstable"})
    status = generate(pod, runtime(ctr("a")), now=T1)
    assert next(c for c in status["conditions"] if c["type"] == "PodScheduled") == scheduled
    assert status["startTime"] == "2025-06-01T10:00:01Z"
    assert status["qosClass"] == "Burstable"  # the API server's word on QoS stands


def test_foreign_conditions_and_readiness_gates():
    gate = {"type": "example.com/ready", "status": "False", "lastTransitionTime": "2025-06-01T10:00:00Z"}
    pod = make_pod(("a",), gates=("example.com/ready", "example.com/missing"), status={"conditions": [gate]})
    status = generate(pod, runtime(ctr("a")))
    assert status["conditions"][0] == gate
    assert conditions(status)["Ready"] == (
        "False", "ReadinessGatesNotReady",
        'the status of pod readiness gate "example.com/ready" is not "True", but False, '
        'corresponding condition of pod readiness gate "example.com/missing" does not exist.')
    assert conditions(status)["ContainersReady"] == ("True", "", "")
    pod["status"]["conditions"] = [{**gate, "status": "True"}, {"type": "example.com/missing", "status": "True"}]
    assert conditions(generate(pod, runtime(ctr("a"))))["Ready"] == ("True", "", "")


def test_disruption_target_is_carried_over():
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                  "lastTransitionTime": T0_TEXT}
    status = generate(make_pod(("a",)), runtime(ctr("a")), old_status={"conditions": [disruption]}, now=T1)
    assert disruption in status["conditions"]


def test_terminal_phase_is_final():
    old = {"phase": "Succeeded", "reason": "Done", "message": "all good"}
    status = generate(make_pod(("a",), policy="OnFailure"), runtime(ctr("a")), old_status=old)
    assert (status["phase"], status["reason"], status["message"]) == ("Succeeded", "Done", "all good")
    api_failed = make_pod(("a",), status={"phase": "Failed"})
    assert generate(api_failed, runtime(ctr("a")), old_status={"phase": "Running"})["phase"] == "Failed"
    # Even another terminal phase cannot replace the one the API server holds.
    api_succeeded = make_pod(("a",), policy="Never", status={"phase": "Succeeded"})
    assert generate(api_succeeded, runtime(ctr("a", EXITED, 1)), old_status={})["phase"] == "Succeeded"


def test_reason_kept_only_while_the_phase_is_the_same():
    old = {"phase": "Pending", "reason": "SomeReason", "message": "m"}
    pending = generate(make_pod(("a",)), runtime(sandboxes=[]), old_status=old)
    assert (pending["reason"], pending["message"]) == ("SomeReason", "m")
    running_now = generate(make_pod(("a",)), runtime(ctr("a")), old_status=old)
    assert "reason" not in running_now and "message" not in running_now


def test_pod_failure_fails_the_pod():
    status = generate(make_pod(("a",)), runtime(sandboxes=[]), pod_failure=("OutOfpods", "Node didn't have enough"))
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "OutOfpods", "Node didn't have enough")
    assert conditions(status)["Ready"] == ("False", "PodFailed", "")


@pytest.mark.parametrize(
    ("codes", "static", "phase"),
    [
        ((0, 0), False, "Succeeded"),
        ((0, 137), False, "Failed"),
        ((0, 0), True, "Running"),
    ],
)
def test_deleted_pod_with_everything_stopped_is_terminal(codes, static, phase):
    pod = make_pod(("a", "b"), deleted=True, static=static)
    status = generate(pod, runtime(ctr("a", EXITED, codes[0]), ctr("b", EXITED, codes[1])),
                      waiting_reasons={"a": ("CrashLoopBackOff", "ignored once deleted")})
    assert status["phase"] == phase
    assert "terminated" in container_status(status, "a")["state"]


def test_deleted_pod_still_running_is_not_terminal():
    pod = make_pod(("a", "b"), deleted=True)
    assert generate(pod, runtime(ctr("a"), ctr("b", EXITED, 0)))["phase"] == "Running"


def test_container_lost_while_running():
    old = generate(make_pod(("a",)), runtime(ctr("a", restarts=4)))
    status = generate(make_pod(("a",)), runtime(), old_status=old, now=T1)
    shown = container_status(status, "a")
    assert shown["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert shown["lastState"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert shown["lastState"]["terminated"]["exitCode"] == 137
    assert shown["restartCount"] == 5
    assert status["phase"] == "Running"


def test_unknown_state_after_running_is_a_termination():
    old = generate(make_pod(("a",)), runtime(ctr("a", id="x", restarts=1)))
    shown = container_status(generate(make_pod(("a",)), runtime(ctr("a", UNKNOWN, id="x", restarts=1)),
                                      old_status=old), "a")
    assert shown["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert shown["restartCount"] == 2


def test_terminated_status_survives_the_runtime_forgetting_it():
    pod = make_pod(("a",), policy="Never")
    old = generate(pod, runtime(ctr("a", EXITED, 1, id="gone")))
    status = generate(pod, runtime(sandboxes=[]), old_status=old, now=T1)
    assert container_status(status, "a")["state"]["terminated"]["containerID"] == "containerd://gone"
    assert status["phase"] == "Failed"


# --- addresses ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("host_network", "sandboxes", "old", "host_ip", "expected"),
    [
        (False, [sandbox(ip="10.1.0.9")], {}, "", ["10.1.0.9"]),
        (False, [sandbox(ip="10.1.0.9")], {"podIP": "10.1.0.2"}, "", ["10.1.0.9"]),
        (False, [sandbox(SandboxState.NOTREADY, ip="")], {"podIPs": [{"ip": "10.1.0.2"}]}, "", ["10.1.0.2"]),
        (False, [], {"podIP": "10.1.0.2"}, "", ["10.1.0.2"]),
        (False, [sandbox(SandboxState.NOTREADY, id="b"), sandbox(id="a")], {"podIP": "10.1.0.2"}, "", []),
        (False, [], {}, "192.168.1.10", []),
        (True, [sandbox(ip="")], {}, "192.168.1.10", ["192.168.1.10"]),
        (True, [sandbox(ip="")], {"podIP": "192.168.1.9"}, "", ["192.168.1.9"]),
    ],
)
def test_pod_ips(host_network, sandboxes, old, host_ip, expected):
    status = generate(make_pod(("a",), host_network=host_network), runtime(sandboxes=sandboxes), old_status=old,
                      host_ip=host_ip)
    assert [entry["ip"] for entry in status.get("podIPs", [])] == expected
    assert status.get("podIP") == (expected[0] if expected else None)


# --- determinism -------------------------------------------------------------------------------

def test_output_is_deterministic_and_inputs_untouched():
    pod = make_pod(("b", "a"), init=("i1",), gates=("g",), status={"conditions": [{"type": "g", "status": "True"}]})
    newest, older = newest_first(ctr("a", EXITED, 1, id="n"), ctr("a", EXITED, 1, id="o"))
    rt = runtime(ctr("i1", EXITED, 0), newest, older, ctr("b"))
    old = {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": T0_TEXT}],
           "containerStatuses": [{"name": "b", "state": {"running": {}}, "restartCount": 1}]}
    kwargs = dict(old_status=old, now=T1, waiting_reasons={"a": ("CrashLoopBackOff", "back-off")},
                  readiness={"b": True}, host_ip="192.168.1.10")
    before = copy.deepcopy((pod, old))
    first = orjson.dumps(generate(pod, rt, **kwargs), option=orjson.OPT_SORT_KEYS)
    second = orjson.dumps(generate(pod, rt, **kwargs), option=orjson.OPT_SORT_KEYS)
    assert first == second
    assert (pod, old) == before
    # Fed back as the old status, the output reproduces itself: a settled pod writes nothing.
    settled = orjson.loads(first)
    again = generate(pod, rt, **{**kwargs, "old_status": settled, "now": T1 + 500})
    assert orjson.dumps(again, option=orjson.OPT_SORT_KEYS) == first


def test_times_are_whole_seconds():
    assert (format_time(T0), format_time(T1 + 0.999)) == (T0_TEXT, T1_TEXT)


def _gated_pod(ready: str, message: str = "", *gates: tuple[str, str], container_ready: bool = True) -> dict:
    conditions = [{"type": kind, "status": value} for kind, value in gates]
    conditions.append({"type": "Ready", "status": ready, **({"message": message} if message else {})})
    return {"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "main", "image": "i"}],
                     "readinessGates": [{"conditionType": "g1"}, {"conditionType": "g2"}]},
            "status": {"phase": "Running", "conditions": conditions,
                       "containerStatuses": [{"name": "main", "ready": container_ready}]}}


@pytest.mark.parametrize("pod, expected", [
    # Both gates True now, Ready still False: worked out again.
    (_gated_pod("False", "", ("g1", "True"), ("g2", "True")), True),
    (_gated_pod("True", "", ("g1", "True"), ("g2", "True")), False),
    # A gate turned False under a Ready pod.
    (_gated_pod("True", "", ("g1", "False"), ("g2", "True")), True),
    # Unready for the same reasons as before: nothing to do.
    (_gated_pod("False", 'the status of pod readiness gate "g1" is not "True", but False', ("g1", "False"),
                ("g2", "True")), False),
    # Unready containers keep Ready False whatever the gates say.
    (_gated_pod("False", "containers with unready status: [main]", ("g1", "True"), ("g2", "True"),
                container_ready=False), False),
    # No gates, or no Ready condition yet: the kubelet's own syncs take care of it.
    ({**_gated_pod("False", "", ("g1", "True"), ("g2", "True")), "spec": {"containers": []}}, False),
    ({"metadata": {}, "spec": {"readinessGates": [{"conditionType": "g1"}]}, "status": {}}, False),
])
def test_readiness_needs_reconcile(pod, expected):
    assert readiness_needs_reconcile(pod) is expected
