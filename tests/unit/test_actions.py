"""compute_pod_actions and its helpers against the kubelet's computePodActions semantics, as tables."""

import hashlib
import itertools

import pytest

from edgelet.container.runtime import (
    ContainerState,
    ContainerStatus,
    PodRuntimeStatus,
    SandboxState,
    SandboxStatus,
)
from edgelet.kuberuntime.actions import (
    REASON_CHANGED,
    REASON_NOT_IN_SPEC,
    REASON_UNHEALTHY,
    REASON_UNKNOWN_STATE,
    ContainerToKill,
    InFlight,
    PodActions,
    compute_pod_actions,
    in_flight_ended,
    kill_grace_seconds,
    next_restart_count,
    pod_has_initialized,
    pod_sandbox_changed,
    should_restart,
)
from tests.helpers import make_pod

RUNNING, EXITED, CREATED, UNKNOWN = (
    ContainerState.RUNNING, ContainerState.EXITED, ContainerState.CREATED, ContainerState.UNKNOWN)
READY, NOTREADY = SandboxState.READY, SandboxState.NOTREADY


def fake_hash(name, image):
    return hashlib.sha256(f"{name}\0{image}".encode()).hexdigest()[:16]


def sandbox(id="sb1", state=READY, attempt=0, host_network=False):
    return SandboxStatus(id=id, name="web", namespace="default", uid="uid-1", attempt=attempt, state=state,
                         created_at=attempt + 1, ip="" if host_network else "10.0.0.5", host_network=host_network)


_ids = itertools.count()


def ctr(name, state=RUNNING, exit_code=0, id=None, hash=None, reason="", sandbox_id="sb1"):
    return ContainerStatus(
        id=id or f"{name}-{next(_ids)}", name=name, sandbox_id=sandbox_id, state=state, created_at=0,
        exit_code=exit_code, reason=reason, image=f"img-{name}",
        hash=fake_hash(name, f"img-{name}") if hash is None else hash,
    )


def runtime(*containers, sandboxes=None):
    return PodRuntimeStatus(uid="uid-1", name="web", namespace="default",
                            sandboxes=[sandbox()] if sandboxes is None else sandboxes,
                            containers=list(containers))


def actions_for(pod, status, **kwargs):
    return compute_pod_actions(pod, status, hasher=fake_hash, **kwargs)


# --- should_restart: every restart policy x last state x exit code -----------------------------

POLICIES = ("Always", "OnFailure", "Never")
SHOULD_RESTART = [
    # last instance,              Always, OnFailure, Never
    (None,                        (True, True, True)),
    ((RUNNING, 0),                (False, False, False)),
    ((CREATED, 0),                (True, True, True)),
    ((UNKNOWN, 0),                (True, True, True)),
    ((EXITED, 0),                 (True, False, False)),
    ((EXITED, 1),                 (True, True, False)),
    ((EXITED, 137),               (True, True, False)),
]


@pytest.mark.parametrize(
    ("latest", "policy", "expected"),
    [(latest, policy, row[i]) for latest, row in SHOULD_RESTART for i, policy in enumerate(POLICIES)],
)
def test_should_restart(latest, policy, expected):
    pod = make_pod(policy=policy)
    status = None if latest is None else ctr("app", latest[0], latest[1])
    assert should_restart(pod, pod["spec"]["containers"][0], status) is expected


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("latest", [None, (EXITED, 1), (CREATED, 0), (UNKNOWN, 0)])
def test_should_restart_never_once_deleted(policy, latest):
    pod = make_pod(policy=policy, deleted=True)
    status = None if latest is None else ctr("app", *latest)
    assert should_restart(pod, pod["spec"]["containers"][0], status) is False


def test_restart_policy_defaults_to_always():
    pod = make_pod()
    assert should_restart(pod, pod["spec"]["containers"][0], ctr("app", EXITED, 0)) is True


# --- sandbox changes ---------------------------------------------------------------------------

SANDBOX_CASES = [
    ("none", [], False, (True, 0, "")),
    ("ready", [sandbox("a", READY, 2)], False, (False, 2, "a")),
    ("not ready", [sandbox("a", NOTREADY, 2)], False, (True, 3, "")),
    ("newest not ready, older ready", [sandbox("b", NOTREADY, 3), sandbox("a", READY, 2)], False, (True, 4, "")),
    ("two ready", [sandbox("b", READY, 1), sandbox("a", READY, 4)], False, (True, 5, "b")),
    ("ready, older dead", [sandbox("b", READY, 1), sandbox("a", NOTREADY, 0)], False, (False, 1, "b")),
    ("became host network", [sandbox("a", READY, 0)], True, (True, 1, "a")),
    ("left host network", [sandbox("a", READY, 0, host_network=True)], False, (True, 1, "a")),
    ("host network unchanged", [sandbox("a", READY, 0, host_network=True)], True, (False, 0, "a")),
]


@pytest.mark.parametrize(("name", "sandboxes", "host_network", "expected"), SANDBOX_CASES,
                         ids=[c[0] for c in SANDBOX_CASES])
def test_pod_sandbox_changed(name, sandboxes, host_network, expected):
    pod = make_pod(host_network=host_network)
    assert pod_sandbox_changed(pod, runtime(sandboxes=sandboxes)) == expected


# --- compute_pod_actions: whole plans ----------------------------------------------------------

def plan(kill_pod=False, create_sandbox=False, sandbox_id="sb1", attempt=0, next_init=(), start=(), kill=(),
         ephemeral=()):
    """The expected PodActions; `next_init` names the init containers to start (a name or a tuple of them),
    `kill` holds (container id, reason) pairs, `ephemeral` indexes of ephemeral containers to start."""
    next_init = (next_init,) if isinstance(next_init, str) else tuple(next_init)
    return (kill_pod, create_sandbox, sandbox_id, attempt, next_init, list(start), sorted(kill), list(ephemeral))


def summary(actions: PodActions, pod=None):
    init_specs = (pod or {}).get("spec", {}).get("initContainers") or []
    next_init = tuple(init_specs[i]["name"] for i in actions.init_containers_to_start)
    return (actions.kill_pod, actions.create_sandbox, actions.sandbox_id, actions.attempt, next_init,
            actions.containers_to_start,
            sorted((cid, k.reason) for cid, k in actions.containers_to_kill.items()),
            actions.ephemeral_containers_to_start)


DEAD = [sandbox("sb1", NOTREADY, 1)]

PLANS = [
    # --- a new pod and sandbox changes
    ("new pod", make_pod(("a", "b")), runtime(sandboxes=[]),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=0, start=[0, 1])),
    ("new pod with init containers", make_pod(("a",), init=("i1", "i2")), runtime(sandboxes=[]),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", next_init="i1")),
    ("sandbox died, Always", make_pod(("a", "b")),
     runtime(ctr("a", EXITED, 0, id="a1"), ctr("b", EXITED, 1, id="b1"), sandboxes=DEAD),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=2, start=[0, 1])),
    ("sandbox died, Never: just stop", make_pod(("a",), policy="Never"),
     runtime(ctr("a", EXITED, 1), sandboxes=DEAD),
     plan(kill_pod=True, sandbox_id="", attempt=2)),
    ("sandbox died before any container, Never: retry", make_pod(("a",), policy="Never"),
     runtime(sandboxes=DEAD),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=2, start=[0])),
    ("sandbox died, OnFailure all succeeded: done", make_pod(("a", "b"), policy="OnFailure"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 0), sandboxes=DEAD),
     plan(kill_pod=True, sandbox_id="", attempt=2)),
    ("sandbox died, OnFailure: restart only the failed", make_pod(("a", "b"), policy="OnFailure"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 2), sandboxes=DEAD),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=2, start=[1])),
    ("sandbox died, OnFailure done, init containers rerun first", make_pod(("a",), init=("i1",),
                                                                            policy="OnFailure"),
     runtime(ctr("i1", EXITED, 0), ctr("a", EXITED, 3), sandboxes=DEAD),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=2, next_init="i1")),
    ("two ready sandboxes", make_pod(("a",)),
     runtime(ctr("a"), sandboxes=[sandbox("new", READY, 2), sandbox("old", READY, 1)]),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="new", attempt=3, start=[0])),
    ("network mode changed", make_pod(("a",), host_network=True), runtime(ctr("a")),
     plan(kill_pod=True, create_sandbox=True, attempt=1, start=[0])),
    # --- steady state and app containers
    ("all running: nothing to do", make_pod(("a", "b")), runtime(ctr("a"), ctr("b")), plan()),
    ("one exited, Always: restart it", make_pod(("a", "b")), runtime(ctr("a"), ctr("b", EXITED, 0)),
     plan(start=[1])),
    ("one succeeded, OnFailure: keep the other", make_pod(("a", "b"), policy="OnFailure"),
     runtime(ctr("a"), ctr("b", EXITED, 0)), plan()),
    ("one failed, OnFailure: restart it", make_pod(("a", "b"), policy="OnFailure"),
     runtime(ctr("a"), ctr("b", EXITED, 1)), plan(start=[1])),
    ("one failed, Never: leave it", make_pod(("a", "b"), policy="Never"),
     runtime(ctr("a"), ctr("b", EXITED, 1)), plan()),
    ("all finished, Never: stop the pod", make_pod(("a", "b"), policy="Never"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 1)), plan(kill_pod=True)),
    ("all succeeded, OnFailure: stop the pod", make_pod(("a",), policy="OnFailure"),
     runtime(ctr("a", EXITED, 0)), plan(kill_pod=True)),
    ("missing container is started", make_pod(("a", "b")), runtime(ctr("a")), plan(start=[1])),
    ("created but never started: start again", make_pod(("a",)), runtime(ctr("a", CREATED)), plan(start=[0])),
    ("unknown state: kill before restart", make_pod(("a",), policy="Never"),
     runtime(ctr("a", UNKNOWN, id="a1")), plan(start=[0], kill=[("a1", REASON_UNKNOWN_STATE)])),
    # --- changed definitions
    ("hash changed: restart", make_pod(("a", "b")), runtime(ctr("a", id="a1", hash="0000"), ctr("b")),
     plan(start=[0], kill=[("a1", REASON_CHANGED)])),
    ("hash changed under Never: restart anyway", make_pod(("a",), policy="Never"),
     runtime(ctr("a", id="a1", hash="0000")), plan(start=[0], kill=[("a1", REASON_CHANGED)])),
    ("empty recorded hash counts as changed", make_pod(("a",)), runtime(ctr("a", id="a1", hash="")),
     plan(start=[0], kill=[("a1", REASON_CHANGED)])),
    ("exited container with an old hash is not killed", make_pod(("a",), policy="Never"),
     runtime(ctr("a", EXITED, 0, hash="0000")), plan(kill_pod=True)),
    # --- containers that are not in the spec
    ("stray running container", make_pod(("a",)), runtime(ctr("a"), ctr("gone", id="g1")),
     plan(kill=[("g1", REASON_NOT_IN_SPEC)])),
    ("stray exited container is left to GC", make_pod(("a",)), runtime(ctr("a"), ctr("gone", EXITED, 0)),
     plan()),
    ("stray next to an unfinished init", make_pod(("a",), init=("i1",)),
     runtime(ctr("i1"), ctr("gone", UNKNOWN, id="g1")), plan(kill=[("g1", REASON_NOT_IN_SPEC)])),
    # --- init containers, one at a time
    ("first init container running", make_pod(("a",), init=("i1", "i2")), runtime(ctr("i1")), plan()),
    ("first init done: start the second", make_pod(("a",), init=("i1", "i2")),
     runtime(ctr("i1", EXITED, 0)), plan(next_init="i2")),
    ("second init only created: start it again", make_pod(("a",), init=("i1", "i2")),
     runtime(ctr("i2", CREATED), ctr("i1", EXITED, 0)), plan(next_init="i2")),
    ("all init done: start the app", make_pod(("a", "b"), init=("i1", "i2")),
     runtime(ctr("i2", EXITED, 0), ctr("i1", EXITED, 0)), plan(start=[0, 1])),
    ("init failed, Always: retry it", make_pod(("a",), init=("i1", "i2")),
     runtime(ctr("i2", EXITED, 1), ctr("i1", EXITED, 0)), plan(next_init="i2")),
    ("init failed, OnFailure: retry it", make_pod(("a",), init=("i1",), policy="OnFailure"),
     runtime(ctr("i1", EXITED, 2)), plan(next_init="i1")),
    ("init failed, Never: the pod fails", make_pod(("a",), init=("i1", "i2"), policy="Never"),
     runtime(ctr("i1", EXITED, 1)), plan(kill_pod=True)),
    ("init OOMKilled with exit 0 is a failure", make_pod(("a",), init=("i1",), policy="Never"),
     runtime(ctr("i1", EXITED, 0, reason="OOMKilled")), plan(kill_pod=True)),
    ("init in unknown state: kill and retry", make_pod(("a",), init=("i1",)),
     runtime(ctr("i1", UNKNOWN, id="i1x")), plan(next_init="i1", kill=[("i1x", REASON_UNKNOWN_STATE)])),
    ("init gone but app running: initialized", make_pod(("a",), init=("i1",)), runtime(ctr("a")), plan()),
    ("app keeps running, restarted app after init", make_pod(("a", "b"), init=("i1",)),
     runtime(ctr("a"), ctr("b", EXITED, 1), ctr("i1", EXITED, 0)), plan(start=[1])),
    # --- deletion
    ("deleted: stop everything", make_pod(("a",), deleted=True), runtime(ctr("a")),
     plan(kill_pod=True)),
    ("deleted before it ever ran: no sandbox", make_pod(("a",), deleted=True), runtime(sandboxes=[]),
     plan(kill_pod=True, sandbox_id="")),
]


@pytest.mark.parametrize(("name", "pod", "status", "expected"), PLANS, ids=[p[0] for p in PLANS])
def test_compute_pod_actions(name, pod, status, expected):
    assert summary(actions_for(pod, status), pod) == expected


# --- native sidecars (init containers with restartPolicy Always) --------------------------------

def sidecar_pod(policy=None, **kwargs):
    """i1 (plain init), s1 (sidecar), i2 (plain init), s2 (sidecar), then app containers a and b."""
    return make_pod(("a", "b"), init=("i1", "s1", "i2", "s2"), sidecars=("s1", "s2"), policy=policy, **kwargs)


SIDECAR_PLANS = [
    # --- started in spec order, the next one once the sidecar runs
    ("new pod: the first init container", sidecar_pod(), runtime(sandboxes=[]),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", next_init="i1")),
    ("i1 done: the sidecar starts", sidecar_pod(), runtime(ctr("i1", EXITED, 0)), plan(next_init="s1")),
    ("sidecar running: the next init container starts", sidecar_pod(),
     runtime(ctr("s1"), ctr("i1", EXITED, 0)), plan(next_init="i2")),
    ("sidecar running, i2 running: wait", sidecar_pod(),
     runtime(ctr("i2"), ctr("s1"), ctr("i1", EXITED, 0)), plan()),
    ("i2 done: the last sidecar starts", sidecar_pod(),
     runtime(ctr("i2", EXITED, 0), ctr("s1"), ctr("i1", EXITED, 0)), plan(next_init="s2")),
    ("last sidecar running: the app containers start", sidecar_pod(),
     runtime(ctr("s2"), ctr("i2", EXITED, 0), ctr("s1"), ctr("i1", EXITED, 0)), plan(start=[0, 1])),
    ("a pod whose only init container is a sidecar", make_pod(("a",), init=("s",), sidecars=("s",)),
     runtime(ctr("s")), plan(start=[0])),
    # --- restarted on exit whatever the pod's restart policy
    ("sidecar exited during initialization: restart it, i2 waits", sidecar_pod(),
     runtime(ctr("s1", EXITED, 1), ctr("i1", EXITED, 0)), plan(next_init="s1")),
    ("sidecar exited 0 beside running apps, Never: restart it", sidecar_pod("Never"),
     runtime(ctr("a"), ctr("b"), ctr("s2"), ctr("s1", EXITED, 0), ctr("i2", EXITED, 0), ctr("i1", EXITED, 0)),
     plan(next_init="s1")),
    ("sidecar failed beside running apps, OnFailure: restart it", sidecar_pod("OnFailure"),
     runtime(ctr("a"), ctr("b"), ctr("s2", EXITED, 2), ctr("s1")), plan(next_init="s2")),
    ("sidecar lost from the runtime after initialization: start it", sidecar_pod(),
     runtime(ctr("a"), ctr("b"), ctr("s2")), plan(next_init="s1")),
    ("plain init containers are not rerun after initialization", sidecar_pod(),
     runtime(ctr("a"), ctr("b"), ctr("s2"), ctr("s1"), ctr("i2", EXITED, 1)), plan()),
    ("sidecar only created: start it again", sidecar_pod(),
     runtime(ctr("s1", CREATED), ctr("i1", EXITED, 0)), plan(next_init="s1")),
    ("sidecar in unknown state: kill and restart", sidecar_pod("Never"),
     runtime(ctr("a"), ctr("b"), ctr("s2"), ctr("s1", UNKNOWN, id="s1x")),
     plan(next_init="s1", kill=[("s1x", REASON_UNKNOWN_STATE)])),
    ("sidecar definition changed: kill and restart", sidecar_pod(),
     runtime(ctr("a"), ctr("b"), ctr("s2"), ctr("s1", id="s1x", hash="0000")),
     plan(next_init="s1", kill=[("s1x", REASON_CHANGED)])),
    # --- a plain init container failing beside a sidecar
    ("i2 failed, Never: the pod fails", sidecar_pod("Never"),
     runtime(ctr("i2", EXITED, 1), ctr("s1"), ctr("i1", EXITED, 0)), plan(kill_pod=True)),
    ("i2 failed, Always: retry it, the sidecar keeps running", sidecar_pod(),
     runtime(ctr("i2", EXITED, 1), ctr("s1"), ctr("i1", EXITED, 0)), plan(next_init="i2")),
    # --- the app containers finish: sidecars do not keep the pod alive
    ("apps succeeded, Never: stop the pod with its sidecars", sidecar_pod("Never"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 0), ctr("s2"), ctr("s1")), plan(kill_pod=True)),
    # Exited apps do not prove initialization (the kubelet's reboot rule): the last sidecar must run
    # again before the pod counts as initialized and is stopped, as the kubelet does.
    ("apps succeeded, OnFailure, the last sidecar exited: it runs again first", sidecar_pod("OnFailure"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 0), ctr("s2", EXITED, 1), ctr("s1")), plan(next_init="s2")),
    ("apps succeeded, OnFailure, the first sidecar exited: stop, no restart", sidecar_pod("OnFailure"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 0), ctr("s2"), ctr("s1", EXITED, 1)), plan(kill_pod=True)),
    ("apps still running, Never: sidecars keep running", sidecar_pod("Never"),
     runtime(ctr("a"), ctr("b", EXITED, 0), ctr("s2"), ctr("s1")), plan()),
    ("sandbox died after the apps succeeded, OnFailure: done", sidecar_pod("OnFailure"),
     runtime(ctr("a", EXITED, 0), ctr("b", EXITED, 0), ctr("s1", EXITED, 137), sandboxes=DEAD),
     plan(kill_pod=True, sandbox_id="", attempt=2)),
]


@pytest.mark.parametrize(("name", "pod", "status", "expected"), SIDECAR_PLANS, ids=[p[0] for p in SIDECAR_PLANS])
def test_compute_pod_actions_with_sidecars(name, pod, status, expected):
    assert summary(actions_for(pod, status), pod) == expected


def sidecar_probes_pod():
    return make_pod(("a",), init=("s", "i"), sidecars=("s",), startup_probe=("s",), liveness_probe=("s",))


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        ({}, plan()),  # no startup result yet: i waits
        ({"startup_succeeded": {"s1"}}, plan(next_init="i")),
        ({"startup_failed": {"s1"}}, plan(next_init="s", kill=[("s1", REASON_UNHEALTHY)])),
        # A failed liveness probe restarts it; the next init container still starts (it had started).
        ({"startup_succeeded": {"s1"}, "liveness_failed": {"s1"}},
         plan(next_init=("s", "i"), kill=[("s1", REASON_UNHEALTHY)])),
        ({"startup_succeeded": {"old"}}, plan()),  # the result of an earlier instance does not count
    ],
)
def test_sidecar_startup_probe_gates_the_next_init_container(probes, expected):
    pod = sidecar_probes_pod()
    assert summary(actions_for(pod, runtime(ctr("s", id="s1")), **probes), pod) == expected


def test_sidecar_probe_kill_messages():
    pod = sidecar_probes_pod()
    actions = actions_for(pod, runtime(ctr("s", id="s1")), startup_failed={"s1"})
    assert actions.containers_to_kill["s1"] == ContainerToKill("s1", "s", REASON_UNHEALTHY,
                                                               "Init container s failed startup probe", "startupProbe")


def test_last_sidecar_must_have_started_before_the_apps_run():
    pod = make_pod(("a",), init=("s",), sidecars=("s",), startup_probe=("s",))
    assert actions_for(pod, runtime(ctr("s", id="s1"))).containers_to_start == []
    assert actions_for(pod, runtime(ctr("s", id="s1")), startup_succeeded={"s1"}).containers_to_start == [0]


@pytest.mark.parametrize("policy", POLICIES)
def test_should_restart_a_sidecar_whatever_the_pod_policy(policy):
    pod = sidecar_pod(policy)
    sidecar = pod["spec"]["initContainers"][1]
    assert should_restart(pod, sidecar, ctr("s1", EXITED, 0)) is True
    assert should_restart(pod, sidecar, ctr("s1", RUNNING)) is False


# --- ephemeral containers ----------------------------------------------------------------------

EPHEMERAL_PLANS = [
    ("added to a running pod: start it", make_pod(("a",), ephemeral=("debug",)), runtime(ctr("a")),
     plan(ephemeral=[0])),
    ("running: nothing to do", make_pod(("a",), ephemeral=("debug",)), runtime(ctr("a"), ctr("debug")), plan()),
    ("exited: never restarted", make_pod(("a",), ephemeral=("debug",), policy="Always"),
     runtime(ctr("a"), ctr("debug", EXITED, 1)), plan()),
    ("only the new one starts", make_pod(("a",), ephemeral=("d1", "d2")),
     runtime(ctr("a"), ctr("d1", EXITED, 0)), plan(ephemeral=[1])),
    ("started while initialization is unfinished", make_pod(("a",), init=("i1",), ephemeral=("debug",)),
     runtime(ctr("i1")), plan(ephemeral=[0])),
    ("a running ephemeral container is not a stray", make_pod(("a",), ephemeral=("debug",)),
     runtime(ctr("a"), ctr("debug", id="d1")), plan()),
    ("not started in a new sandbox", make_pod(("a",), ephemeral=("debug",)), runtime(sandboxes=[]),
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", start=[0])),
    ("not started in a pod being deleted", make_pod(("a",), ephemeral=("debug",), deleted=True),
     runtime(ctr("a")), plan(kill_pod=True)),
]


@pytest.mark.parametrize(("name", "pod", "status", "expected"), EPHEMERAL_PLANS, ids=[p[0] for p in EPHEMERAL_PLANS])
def test_compute_pod_actions_with_ephemeral_containers(name, pod, status, expected):
    assert summary(actions_for(pod, status), pod) == expected


# --- probes ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("policy", "probe", "expected"),
    [
        ("Always", "liveness", plan(start=[0], kill=[("a1", REASON_UNHEALTHY)])),
        ("OnFailure", "liveness", plan(start=[0], kill=[("a1", REASON_UNHEALTHY)])),
        ("Never", "liveness", plan(kill_pod=True, kill=[("a1", REASON_UNHEALTHY)])),
        ("Always", "startup", plan(start=[0], kill=[("a1", REASON_UNHEALTHY)])),
        ("Never", "startup", plan(kill_pod=True, kill=[("a1", REASON_UNHEALTHY)])),
    ],
)
def test_probe_failure_kills_and_restarts_per_policy(policy, probe, expected):
    actions = actions_for(make_pod(("a",), policy=policy), runtime(ctr("a", id="a1")),
                          **{f"{probe}_failed": {"a1"}})
    assert summary(actions, None) == expected
    kill = actions.containers_to_kill["a1"]
    restarts = policy != "Never"
    assert kill == ContainerToKill("a1", "a", REASON_UNHEALTHY,
                                   f"Container a failed {probe} probe" + (", will be restarted" if restarts else ""),
                                   f"{probe}Probe")


def test_probe_results_belong_to_one_container_instance():
    # A failure of the previous instance must not kill the new one.
    actions = actions_for(make_pod(("a",)), runtime(ctr("a", id="new")), liveness_failed={"old"})
    assert actions.no_change()


def test_changed_definition_wins_over_probe_failure():
    actions = actions_for(make_pod(("a",)), runtime(ctr("a", id="a1", hash="0")), liveness_failed={"a1"})
    assert actions.containers_to_kill["a1"].reason == REASON_CHANGED
    assert actions.containers_to_kill["a1"].message == "Container a definition changed, will be restarted"


def test_liveness_failure_keeps_the_healthy_sibling_running():
    actions = actions_for(make_pod(("a", "b"), policy="Never"), runtime(ctr("a", id="a1"), ctr("b", id="b1")),
                          liveness_failed=["a1"])
    assert (actions.kill_pod, list(actions.containers_to_kill), actions.containers_to_start) == (False, ["a1"], [])


# --- initialization ---------------------------------------------------------------------------

@pytest.mark.parametrize(("state", "expected"), [(RUNNING, True), (CREATED, True), (EXITED, False),
                                                 (UNKNOWN, False)])
def test_pod_has_initialized_by_app_container_state(state, expected):
    # Exited app containers do not prove it: after a reboot every container is exited.
    assert pod_has_initialized(make_pod(("a",), init=("i1",)), runtime(ctr("a", state))) is expected


def test_newest_instance_decides():
    # i1 failed once, then succeeded: the newest (first in the list) is what counts.
    pod = make_pod(("a",), init=("i1",))
    status = runtime(ctr("i1", EXITED, 0), ctr("i1", EXITED, 1))
    assert actions_for(pod, status).containers_to_start == [0]


# --- PodActions --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"kill_pod": True}, False),
        ({"create_sandbox": True}, False),
        ({"init_containers_to_start": [0]}, False),
        ({"ephemeral_containers_to_start": [0]}, False),
        ({"containers_to_start": [0]}, False),
        ({"containers_to_kill": {"x": ContainerToKill("x", "n", "r", "m")}}, False),
        ({"attempt": 3, "sandbox_id": "sb"}, True),
    ],
)
def test_no_change(changes, expected):
    base = {"kill_pod": False, "create_sandbox": False, "sandbox_id": "", "attempt": 0}
    assert PodActions(**{**base, **changes}).no_change() is expected


def test_inputs_are_not_modified():
    pod = make_pod(("a", "b"), init=("i1",))
    status = runtime(ctr("a", id="a1", hash="0"), ctr("i1", EXITED, 0))
    before = (repr(pod), repr(status))
    actions_for(pod, status, liveness_failed={"a1"})
    assert (repr(pod), repr(status)) == before


def test_default_hasher_is_the_agent_container_hash():
    core = pytest.importorskip("edgelet.core")
    pod = make_pod(("a",))
    good = ctr("a", id="a1", hash=core.container_hash("a", "img-a"))
    assert compute_pod_actions(pod, runtime(good)).no_change()
    stale = ctr("a", id="a1", hash=fake_hash("a", "img-a"))
    assert compute_pod_actions(pod, runtime(stale)).containers_to_kill["a1"].reason == REASON_CHANGED


def _grace_pod(deletion_grace=None, **probes) -> dict:
    container = {"name": "a", "image": "i", **{kind: {"exec": {"command": ["x"]}, **extra}
                                                for kind, extra in probes.items()}}
    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {"terminationGracePeriodSeconds": 500,
                                                           "containers": [container]}}
    if deletion_grace is not None:
        pod["metadata"]["deletionGracePeriodSeconds"] = deletion_grace
    return pod


@pytest.mark.parametrize("pod, probe, expected", [
    # The failed probe's own grace period wins over the pod's (setTerminationGracePeriod).
    (_grace_pod(livenessProbe={"terminationGracePeriodSeconds": 5}), "livenessProbe", 5),
    (_grace_pod(startupProbe={"terminationGracePeriodSeconds": 7}), "startupProbe", 7),
    # Only the probe that failed counts; without one of its own, the pod's.
    (_grace_pod(livenessProbe={"terminationGracePeriodSeconds": 5}), "startupProbe", 500),
    (_grace_pod(livenessProbe={}), "livenessProbe", 500),
    (_grace_pod(livenessProbe={"terminationGracePeriodSeconds": 5}), "", 500),  # a changed definition, say
    # A deletion's grace period comes first.
    (_grace_pod(3, livenessProbe={"terminationGracePeriodSeconds": 5}), "livenessProbe", 3),
])
def test_kill_grace_seconds(pod, probe, expected):
    assert kill_grace_seconds(pod, ContainerToKill("a1", "a", REASON_UNHEALTHY, "m", probe)) == expected


# --- creates and starts under way in the runtime (a slow runtime, or one that refused a create) ---------------

def created(name, id, attempt=0, sandbox_id="sb1", state=CREATED):
    container = ctr(name, state, id=id, sandbox_id=sandbox_id)
    container.attempt = container.restart_count = attempt
    return container


CREATE = InFlight("app", 0)  # a create whose reply did not come, or whose name the runtime said was reserved
START = InFlight("app", 0, "c1")  # a start of container c1 whose reply did not come

# name, pod, status, what is under way, expected plan, containers awaited
IN_FLIGHT_PLANS = [
    ("a create under way: nothing started, the pod and its sandbox kept",
     make_pod(), runtime(), [CREATE], plan(), ["app"]),
    ("a start under way: not started again, not killed",
     make_pod(), runtime(created("app", "c1")), [START], plan(), ["app"]),
    ("a start under way beside a running sibling",
     make_pod(("app", "side")), runtime(created("app", "c1"), ctr("side")), [START], plan(), ["app"]),
    ("under way in a sandbox that died: the sandbox follows its own state alone",
     make_pod(), runtime(created("app", "c1"), sandboxes=DEAD), [START],
     plan(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=2, start=[0]), []),
    ("a container that runs needs no waiting",
     make_pod(), runtime(ctr("app", id="c1")), [START], plan(), []),
    ("an init container under way holds back what follows it",
     make_pod(init=("setup", "next")), runtime(), [InFlight("setup", 0)], plan(), ["setup"]),
    ("nothing under way: the created container is started",
     make_pod(), runtime(created("app", "c1")), [], plan(start=[0]), []),
    ("under way and the only app container: the pod is not taken for done",
     make_pod(policy="Never"), runtime(), [CREATE], plan(), ["app"]),
]


@pytest.mark.parametrize(("name", "pod", "status", "in_flight", "expected", "awaited"), IN_FLIGHT_PLANS,
                         ids=[p[0] for p in IN_FLIGHT_PLANS])
def test_compute_pod_actions_with_calls_under_way(name, pod, status, in_flight, expected, awaited):
    actions = actions_for(pod, status, in_flight=in_flight)
    assert summary(actions, pod) == expected
    assert actions.awaited == awaited


# name, what is under way (since 0), containers the runtime shows, seconds since, ended
IN_FLIGHT_ENDS = [
    ("a create not showing yet", CREATE, [], 1.0, False),
    ("a create showing its container", CREATE, [created("app", "c1")], 1.0, True),
    ("a create showing only an older instance", InFlight("app", 2), [created("app", "c1", attempt=1)], 1.0, False),
    ("a create showing nothing for a whole timeout", CREATE, [], 5.0, True),
    ("a start still in the created state", START, [created("app", "c1")], 1.0, False),
    ("a start that got the container running", START, [created("app", "c1", state=RUNNING)], 1.0, True),
    ("a start that ended the container", START, [created("app", "c1", state=EXITED)], 1.0, True),
    ("a start whose container is gone", START, [], 1.0, True),
    ("a start still in the created state for a whole timeout", START, [created("app", "c1")], 5.0, True),
]


@pytest.mark.parametrize(("name", "op", "containers", "after", "ended"), IN_FLIGHT_ENDS,
                         ids=[e[0] for e in IN_FLIGHT_ENDS])
def test_in_flight_ended(name, op, containers, after, ended):
    assert in_flight_ended(op, runtime(*containers), now=after, patience=5.0) is ended


# name, containers the runtime shows, next restart count of "app"
RESTART_COUNTS = [
    ("never ran", [], 0),
    ("one instance", [created("app", "c1", attempt=0, state=EXITED)], 1),
    ("instances in an older sandbox count too",
     [created("app", "c2", attempt=3, sandbox_id="sb0", state=EXITED), created("app", "c1", attempt=1)], 4),
    ("other containers' counts do not", [created("side", "s1", attempt=7)], 0),
]


@pytest.mark.parametrize(("name", "containers", "expected"), RESTART_COUNTS, ids=[r[0] for r in RESTART_COUNTS])
def test_next_restart_count(name, containers, expected):
    assert next_restart_count(runtime(*containers), "app") == expected
