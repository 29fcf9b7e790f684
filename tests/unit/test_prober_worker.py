"""The probe worker's state machine, one tick at a time: thresholds, startup gating, new container
instances, on-hold after a liveness failure, initial delay, shutdown, errors and metrics."""

from __future__ import annotations

import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus
from edgelet.metrics import registry as metrics
from edgelet.prober.probes import ProbeSpec
from edgelet.prober.results import INITIAL_RESULT, Outcome, ProbeError, ProbeType, Result, ResultsCache
from edgelet.prober.worker import ProbeWorker
from tests.helpers import make_pod
from tests.scrape import sample_value

S, F, U = Result.SUCCESS, Result.FAILURE, Result.UNKNOWN
NOW = 1_700_000_000.0
UID = "uid-1"


def prober_pod(*, policy="Always", deleted=False, name="web"):
    return make_pod(policy=policy, deleted=deleted, name=name, namespace="ns", uid=UID, image="img")


def running(cid="c1", started_ago=100.0, state=ContainerState.RUNNING):
    return ContainerStatus(id=cid, name="app", sandbox_id="s1", state=state, created_at=0,
                           started_at=int((NOW - started_ago) * 1e9))


class Harness:
    """A worker over scripted check outcomes, a settable container and a settable wall clock."""

    def __init__(self, probe_type, *, pod=None, container=None, started=True, **timing):
        self.container: ContainerStatus | None = running()
        self.outcomes: list[Result | Exception] = []
        self.checked: list[str] = []
        self.changes: list[tuple[str, Result]] = []
        self.events: list[tuple[str, str, str, str]] = []  # (fieldPath, type, reason, message)
        self.now = NOW
        self.started = started
        self.results = ResultsCache(probe_type, lambda uid, cid, result: self.changes.append((cid, result)))
        spec = ProbeSpec(handler="exec", action={"command": ["true"]}, **timing)
        self.worker = ProbeWorker(
            probe_type, pod or prober_pod(), container or {"name": "app"}, spec,
            results=self.results, check=self._check,
            container_lookup=lambda uid, name: self.container if (uid, name) == (UID, "app") else None,
            is_started=lambda cid: self.started, wall_clock=lambda: self.now, recorder=self,
        )

    def event(self, ref, event_type, reason, message):
        self.events.append((ref.get("fieldPath"), event_type, reason, message))

    async def _check(self, spec, container, container_id):
        self.checked.append(container_id)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, Outcome):
            return outcome
        return Outcome(outcome, "scripted")

    async def ticks(self, *outcomes):
        """Feeds outcomes one per tick; returns the stored result after each."""
        stored = []
        for outcome in outcomes:
            self.outcomes.append(outcome)
            assert await self.worker.do_probe()
            stored.append(self.result())
        return stored

    def result(self, cid="c1"):
        return self.results.get(cid)


@pytest.mark.parametrize("probe_type, timing, outcomes, expected", [
    # readiness: starts failed; one success makes it ready; three failures in a row unready.
    (ProbeType.READINESS, {}, [S, F, F, F, S], [S, S, S, F, S]),
    (ProbeType.READINESS, {"success_threshold": 2}, [S, F, S, S, S], [F, F, F, S, S]),
    (ProbeType.READINESS, {"failure_threshold": 1}, [S, F, S], [S, F, S]),
    # a failure run broken by a success starts over
    (ProbeType.READINESS, {}, [S, F, F, S, F, F], [S, S, S, S, S, S]),
    # liveness: alive until failure_threshold failures in a row
    (ProbeType.LIVENESS, {}, [F, F, S, F, F], [S, S, S, S, S]),
    (ProbeType.LIVENESS, {"failure_threshold": 2}, [F, F], [S, F]),
])
async def test_thresholds(probe_type, timing, outcomes, expected):
    harness = Harness(probe_type, **timing)
    assert await harness.ticks(*outcomes) == expected


async def test_initial_results_before_any_probe():
    for probe_type, initial in [(ProbeType.READINESS, F), (ProbeType.LIVENESS, S), (ProbeType.STARTUP, U)]:
        harness = Harness(probe_type, initial_delay=1000)
        assert await harness.worker.do_probe()
        assert harness.result() is initial and not harness.checked


async def test_liveness_failure_holds_until_a_new_container():
    harness = Harness(ProbeType.LIVENESS, failure_threshold=1)
    assert await harness.ticks(F) == [F]
    assert harness.worker.on_hold
    assert await harness.worker.do_probe() and harness.checked == ["c1"]  # held: no probe

    harness.container = running("c2")
    assert await harness.ticks(S) == [None]  # the old instance's result is gone
    assert harness.result("c2") is S and harness.checked == ["c1", "c2"]
    assert not harness.worker.on_hold


async def test_startup_failure_holds_and_readiness_failure_does_not():
    startup = Harness(ProbeType.STARTUP, started=False, failure_threshold=2)
    assert await startup.ticks(F, F) == [U, F]
    assert startup.worker.on_hold

    readiness = Harness(ProbeType.READINESS, failure_threshold=1)
    await readiness.ticks(F)
    assert not readiness.worker.on_hold
    assert await readiness.ticks(S) == [S]


async def test_new_container_resets_the_run():
    harness = Harness(ProbeType.LIVENESS, failure_threshold=3)
    await harness.ticks(F, F)
    harness.container = running("c2")
    assert await harness.ticks(F, F) == [None, None]
    assert harness.result("c2") is S  # two failures of the new instance are not three


@pytest.mark.parametrize("probe_type, started, probes", [
    (ProbeType.READINESS, False, False),  # waits for the startup probe
    (ProbeType.LIVENESS, False, False),
    (ProbeType.READINESS, True, True),
    (ProbeType.LIVENESS, True, True),
    (ProbeType.STARTUP, False, True),
    (ProbeType.STARTUP, True, False),  # done once the container started
])
async def test_startup_gates_the_other_probes(probe_type, started, probes):
    harness = Harness(probe_type, started=started)
    harness.outcomes.append(S)
    assert await harness.worker.do_probe()
    assert bool(harness.checked) is probes


async def test_startup_success_is_stored():
    harness = Harness(ProbeType.STARTUP, started=False)
    assert await harness.ticks(F, S) == [U, S]


@pytest.mark.parametrize("state, policy, keeps_going", [
    (ContainerState.EXITED, "Never", False),
    (ContainerState.EXITED, "OnFailure", True),
    (ContainerState.EXITED, "Always", True),
    (ContainerState.UNKNOWN, "Never", True),
])
async def test_non_running_container_fails_and_stops_only_for_good(state, policy, keeps_going):
    harness = Harness(ProbeType.READINESS, pod=prober_pod(policy=policy))
    harness.container = running(state=state)
    assert await harness.worker.do_probe() is keeps_going
    assert harness.result() is F and not harness.checked


@pytest.mark.parametrize("probe_type", [ProbeType.READINESS, ProbeType.LIVENESS, ProbeType.STARTUP])
async def test_a_container_created_but_not_started_keeps_its_initial_result(probe_type):
    # Seen between CreateContainer and StartContainer: a FAILURE stored for it would count against the instance
    # once it runs (a sidecar whose startup probe "failed" is killed at once).
    harness = Harness(probe_type, started=probe_type is not ProbeType.STARTUP)
    harness.container = running(state=ContainerState.CREATED)
    assert await harness.worker.do_probe() is True
    assert harness.result() is INITIAL_RESULT[probe_type] and not harness.checked
    harness.container = running(started_ago=0)  # the same instance, started
    harness.outcomes.append(S)
    assert await harness.worker.do_probe() is True
    assert harness.checked == ["c1"] and harness.result() is S


@pytest.mark.parametrize("probe_type", [ProbeType.READINESS, ProbeType.LIVENESS, ProbeType.STARTUP])
async def test_an_exited_sidecar_is_probed_again_under_never(probe_type):
    # A sidecar restarts whatever the pod's policy: its worker waits for the next instance (a worker that
    # stopped would no longer hold the pod's readiness back).
    harness = Harness(probe_type, pod=prober_pod(policy="Never"), container={"name": "app", "restartPolicy": "Always"},
                      initial_delay=10)
    harness.container = running(state=ContainerState.EXITED)
    assert await harness.worker.do_probe() is True
    assert harness.result() is F
    harness.container = running(cid="c2", started_ago=0)
    assert await harness.worker.do_probe() is True
    assert not harness.checked and harness.result("c2") is INITIAL_RESULT[probe_type] and harness.result("c1") is None


async def test_missing_container_waits():
    harness = Harness(ProbeType.READINESS)
    harness.container = None
    assert await harness.worker.do_probe()
    assert len(harness.results) == 0 and not harness.checked


async def test_initial_delay_counts_from_the_container_start():
    harness = Harness(ProbeType.READINESS, initial_delay=10)
    harness.container = running(started_ago=5)
    harness.outcomes.append(S)
    assert await harness.worker.do_probe()
    assert not harness.checked and harness.result() is F
    harness.now += 5
    assert await harness.worker.do_probe()
    assert harness.checked == ["c1"] and harness.result() is S


@pytest.mark.parametrize("probe_type, keeps_going", [
    (ProbeType.LIVENESS, False), (ProbeType.STARTUP, False), (ProbeType.READINESS, True)])
async def test_pod_deletion_quiets_liveness_and_startup(probe_type, keeps_going):
    harness = Harness(probe_type, pod=prober_pod(deleted=True), started=probe_type is not ProbeType.STARTUP)
    harness.outcomes.append(F)
    assert await harness.worker.do_probe() is keeps_going
    assert harness.result() is (S if not keeps_going else F)


async def test_errors_are_thrown_away():
    harness = Harness(ProbeType.LIVENESS, failure_threshold=2)
    assert await harness.ticks(F, ProbeError("no pod IP"), F) == [S, S, F]


async def test_changes_are_reported_once():
    harness = Harness(ProbeType.READINESS)
    await harness.ticks(S, S, F, F, F, F)
    assert harness.changes == [("c1", F), ("c1", S), ("c1", F)]


async def test_metrics_count_each_result():
    pod = prober_pod(name="metered")
    harness = Harness(ProbeType.READINESS, pod=pod)
    labels = {"probe_type": "Readiness", "container": "app", "pod": "metered", "namespace": "ns",
              "pod_uid": UID}

    def count(result):
        return sample_value(metrics.PROBES, "prober_probe_total", {**labels, "result": result}) or 0.0

    await harness.ticks(S, S, F)
    assert (count("successful"), count("failed")) == (2.0, 1.0)
    harness.worker.forget()
    assert (count("successful"), count("failed")) == (0.0, 0.0)
    assert harness.result() is None


async def test_every_failed_probe_is_an_unhealthy_event_and_warnings_a_probe_warning():
    harness = Harness(ProbeType.LIVENESS, failure_threshold=3)
    redirect = Outcome(S, "Probe terminated redirects (status 302)", warning=True)
    await harness.ticks(F, ProbeError("no pod IP"), S, redirect, F)
    assert harness.events == [
        ("spec.containers{app}", "Warning", "Unhealthy", "Liveness probe failed: scripted"),
        ("spec.containers{app}", "Warning", "ProbeWarning",
         "Liveness probe warning: Probe terminated redirects (status 302)"),
        ("spec.containers{app}", "Warning", "Unhealthy", "Liveness probe failed: scripted"),
    ]
