"""ProbeManager bookkeeping: workers per probe, spec updates, removal, the results the sync and the
status read, and which changes ask for a re-sync. Workers are ticked by hand over scripted checks."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus
from edgelet.prober.manager import ProbeManager
from edgelet.prober.results import Outcome, ProbeError, ProbeType, Result
from edgelet.prober.worker import ProbeWorker
from tests.helpers import make_pod

UID = "uid-1"


def probed_pod(**probes_by_container):
    """probed_pod(app={"livenessProbe": ...}, side={}) -> a pod with those containers and their probes."""
    return make_pod(tuple(probes_by_container), namespace="ns", uid=UID, image="img", fields=probes_by_container)
LIVE, READY, START = ProbeType.LIVENESS, ProbeType.READINESS, ProbeType.STARTUP


def exec_probe(word, **timing):
    return {"exec": {"command": [word]}, **timing}


class ScriptedProber:
    """Answers each probe by the word of its exec command: verdicts[word] -> Result or ProbeError."""

    def __init__(self):
        self.verdicts: dict[str, Result | Exception] = {}
        self.calls: list[tuple[str, str, str]] = []

    async def probe(self, spec, container, container_id, pod_ip):
        word = spec.action["command"][0]
        self.calls.append((word, container_id, pod_ip))
        verdict = self.verdicts[word]
        if isinstance(verdict, Exception):
            raise verdict
        return Outcome(verdict)

    async def close(self):
        pass


class Env:
    """A manager over scripted probes and a settable set of containers; ticks workers by hand."""

    def __init__(self):
        self.containers: dict[str, ContainerStatus] = {}
        self.changes: list[str] = []
        self.prober = ScriptedProber()
        self.manager = ProbeManager(
            None, on_change=self.changes.append,
            container_lookup=lambda uid, name: self.containers.get(name) if uid == UID else None,
            pod_ip=lambda uid: "10.1.0.9", prober=self.prober,
        )

    def run(self, name, cid):
        self.containers[name] = ContainerStatus(id=cid, name=name, sandbox_id="s", state=ContainerState.RUNNING,
                                                created_at=1, started_at=1)

    def stop(self, name):
        self.containers[name].state = ContainerState.EXITED

    async def tick(self, name, probe_type):
        worker = self.manager.worker(UID, name, probe_type)
        assert worker is not None, f"no {probe_type} worker for {name}"
        return await worker.do_probe()


@pytest.fixture
async def env(monkeypatch):
    async def parked(self, first_delay=0.0):
        await asyncio.Event().wait()

    # The workers' own loops stay parked: each test ticks them by hand.
    monkeypatch.setattr(ProbeWorker, "run", parked)
    env = Env()
    yield env
    await env.manager.close()


def workers(manager):
    return {(name, t) for t in ProbeType for name in ("app", "side") if manager.worker(UID, name, t)}


async def test_one_worker_per_probe(env):
    env.manager.add_pod(probed_pod(app={"livenessProbe": exec_probe("l"), "readinessProbe": exec_probe("r")},
                                 side={"startupProbe": exec_probe("s")}))
    assert workers(env.manager) == {("app", LIVE), ("app", READY), ("side", START)}
    assert env.manager.worker_count() == 3


async def test_update_restarts_only_changed_probes(env):
    pod = probed_pod(app={"livenessProbe": exec_probe("l"), "readinessProbe": exec_probe("r")})
    env.manager.add_pod(pod)
    liveness, readiness = env.manager.worker(UID, "app", LIVE), env.manager.worker(UID, "app", READY)

    changed = copy.deepcopy(pod)
    changed["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    changed["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = 3
    del changed["spec"]["containers"][0]["livenessProbe"]
    changed["spec"]["containers"][0]["startupProbe"] = exec_probe("s")
    env.manager.update_pod(changed)

    assert workers(env.manager) == {("app", READY), ("app", START)}
    assert env.manager.worker(UID, "app", READY) is not readiness
    assert env.manager.worker(UID, "app", READY).spec.period == 3
    assert liveness.pod is pod  # stopped workers are left alone

    same = copy.deepcopy(changed)
    env.manager.update_pod(same)
    assert env.manager.worker(UID, "app", READY).pod is same  # unchanged workers see the new pod


async def test_readiness_follows_the_current_container(env):
    env.manager.add_pod(pod := probed_pod(app={"readinessProbe": exec_probe("r")}, side={}))
    assert env.manager.readiness(pod) == {"app": False}  # not running yet; "side" has no probe

    env.run("app", "c1")
    env.prober.verdicts["r"] = Result.SUCCESS
    await env.tick("app", READY)
    assert env.manager.readiness(pod) == {"app": True}
    assert env.prober.calls == [("r", "c1", "10.1.0.9")]

    env.run("app", "c2")  # restarted: the new instance is not ready until probed
    assert env.manager.readiness(pod) == {"app": False}
    await env.tick("app", READY)
    assert env.manager.readiness(pod) == {"app": True}

    env.stop("app")
    assert env.manager.readiness(pod) == {"app": False}


async def test_startup_gates_readiness_and_liveness(env):
    env.manager.add_pod(pod := probed_pod(app={"startupProbe": exec_probe("s", failureThreshold=2),
                                      "readinessProbe": exec_probe("r"), "livenessProbe": exec_probe("l")}))
    env.run("app", "c1")
    env.prober.verdicts.update(s=Result.FAILURE, r=Result.SUCCESS, l=Result.SUCCESS)
    for probe_type in (READY, LIVE, START):
        await env.tick("app", probe_type)
    assert [word for word, _, _ in env.prober.calls] == ["s"]
    assert env.manager.started(pod) == {"app": False}
    assert env.manager.readiness(pod) == {"app": False}

    env.prober.verdicts["s"] = Result.SUCCESS
    await env.tick("app", START)
    assert env.manager.started(pod) == {"app": True}
    await env.tick("app", READY)
    await env.tick("app", LIVE)
    assert [word for word, _, _ in env.prober.calls] == ["s", "s", "r", "l"]
    assert env.manager.readiness(pod) == {"app": True}


async def test_startup_failure_is_reported_by_container_id(env):
    env.manager.add_pod(probed_pod(app={"startupProbe": exec_probe("s", failureThreshold=1)}))
    env.run("app", "c1")
    env.prober.verdicts["s"] = Result.FAILURE
    await env.tick("app", START)
    assert env.manager.startup_failed(UID) == {"c1"}
    assert env.manager.liveness_failed(UID) == set()

    env.run("app", "c2")
    await env.tick("app", START)  # a new instance starts over
    assert env.manager.startup_failed(UID) == {"c2"}


async def test_liveness_failure_and_resyncs(env):
    env.manager.add_pod(probed_pod(app={"livenessProbe": exec_probe("l", failureThreshold=2),
                                      "readinessProbe": exec_probe("r", failureThreshold=1)}))
    env.run("app", "c1")
    env.prober.verdicts.update(l=Result.FAILURE, r=Result.SUCCESS)

    await env.tick("app", LIVE)  # initial "alive" is stored: no re-sync for that
    assert env.changes == []
    await env.tick("app", READY)  # initial "not ready", then ready: two changes
    assert env.changes == [UID, UID]

    await env.tick("app", LIVE)
    assert env.manager.liveness_failed(UID) == {"c1"}
    assert env.changes == [UID, UID, UID]

    env.prober.verdicts["r"] = Result.SUCCESS
    await env.tick("app", READY)  # unchanged: no re-sync
    assert env.changes == [UID, UID, UID]


async def test_errors_leave_results_alone(env):
    env.manager.add_pod(pod := probed_pod(app={"readinessProbe": exec_probe("r", failureThreshold=1)}))
    env.run("app", "c1")
    env.prober.verdicts["r"] = ProbeError("no address")
    await env.tick("app", READY)
    assert env.manager.readiness(pod) == {"app": False}


async def test_invalid_probe_never_passes_and_is_logged_once(env, caplog):
    pod = probed_pod(app={"readinessProbe": {"exec": {"command": []}}, "startupProbe": {"tcpSocket": {}}})
    with caplog.at_level(logging.ERROR, logger="edgelet.prober.manager"):
        env.manager.add_pod(pod)
        env.manager.update_pod(copy.deepcopy(pod))
    assert env.manager.worker_count() == 0
    env.run("app", "c1")
    assert env.manager.readiness(pod) == {"app": False}
    assert env.manager.started(pod) == {"app": False}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert any("spec.containers[app].readinessProbe.exec.command" in m for m in messages)


async def test_remove_pod_and_stop_liveness_and_startup(env):
    env.manager.add_pod(pod := probed_pod(app={"livenessProbe": exec_probe("l", failureThreshold=1),
                                      "startupProbe": exec_probe("s"), "readinessProbe": exec_probe("r")}))
    env.run("app", "c1")
    env.prober.verdicts.update(s=Result.SUCCESS, l=Result.FAILURE)
    await env.tick("app", START)
    await env.tick("app", LIVE)
    assert env.manager.liveness_failed(UID) == {"c1"}

    env.manager.stop_liveness_and_startup(UID)
    assert workers(env.manager) == {("app", READY)}
    assert env.manager.liveness_failed(UID) == set()
    assert env.manager.started(pod) == {"app": True}  # nothing holds a terminating container back

    env.manager.remove_pod(UID)
    assert env.manager.worker_count() == 0 and env.manager.liveness_failed(UID) == set()
    # Nothing of the pod is kept: no worker, no result holds its containers back.
    assert env.manager.readiness(pod) == {"app": True} and env.manager.started(pod) == {"app": True}


async def test_sidecars_are_probed_and_plain_init_containers_are_not(env):
    pod = probed_pod(app={})
    pod["spec"]["initContainers"] = [
        {"name": "side", "image": "img", "restartPolicy": "Always", "startupProbe": exec_probe("s"),
         "readinessProbe": exec_probe("r")},
        {"name": "setup", "image": "img", "readinessProbe": exec_probe("never")}]  # refused by validation anyway
    env.manager.add_pod(pod)
    assert workers(env.manager) == {("side", START), ("side", READY)}
    assert env.manager.worker(UID, "setup", READY) is None
    env.run("side", "c1")
    env.prober.verdicts.update(s=Result.SUCCESS, r=Result.SUCCESS)
    await env.tick("side", START)
    assert env.manager.startup_succeeded(UID) == {"c1"}  # the next init container may start
    assert env.manager.started(pod) == {"side": True}
    await env.tick("side", READY)
    assert env.manager.readiness(pod) == {"side": True}
