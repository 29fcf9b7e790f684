"""Graceful node shutdown: which pods stop in which group with which grace, the order and budgets the manager
keeps (fake clock), and how it says that logind is missing (a scripted inhibitor; the D-Bus side is tested under
systemd in tests/package)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgelet.config import ShutdownConfig, parse_config
from edgelet.eviction.policy import is_critical
from edgelet.lifecycle.shutdown import ADMIT_REASON, MESSAGE, NOT_READY_MESSAGE, REASON, ShutdownManager, plan_shutdown
from edgelet.util.errors import ConfigError


def pod(name: str, *, critical: bool = False, grace: int | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if critical:
        spec["priority"] = 2_000_001_000  # system-node-critical
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": spec}


def names(stage) -> list[tuple[str, int]]:
    return [(p["metadata"]["name"], grace) for p, grace in stage.pods]


@pytest.mark.parametrize("grace, critical_grace, pods, regular, critical", [
    # Regular pods get the whole minus the critical part; a shorter own grace wins.
    (30, 10, [pod("web", grace=60), pod("db", grace=5), pod("dns", critical=True, grace=30)],
     [("web", 20), ("db", 5)], [("dns", 10)]),
    # No critical part: critical pods are stopped at once (grace 0), as the kubelet does.
    (10, 0, [pod("web"), pod("dns", critical=True)], [("web", 10)], [("dns", 0)]),
    # Everything for critical pods: regular pods get 0.
    (10, 10, [pod("web", grace=3), pod("dns", critical=True, grace=3)], [("web", 0)], [("dns", 3)]),
    (5, 2, [], [], []),
])
def test_plan(grace, critical_grace, pods, regular, critical):
    stages = plan_shutdown(pods, grace, critical_grace, is_critical)
    assert [s.name for s in stages] == ["regular", "critical"]
    assert [s.budget for s in stages] == [grace - critical_grace, critical_grace]
    assert names(stages[0]) == regular and names(stages[1]) == critical


def test_static_and_mirror_pods_are_critical():
    static = pod("static")
    static["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    [regular, critical] = plan_shutdown([static, pod("plain")], 10, 4, is_critical)
    assert names(regular) == [("plain", 6)] and names(critical) == [("static", 4)]


class FakeNode:
    """The agent side of a shutdown on a fake clock: pods stop `stop_after` seconds after being told."""

    def __init__(self, pods: list[dict], stop_after: dict[str, float]):
        self.now = 0.0
        self.pods = pods
        self.stop_after = stop_after
        self.events: list[tuple[float, str]] = []
        self.stopping: dict[str, float] = {}
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(seconds, 0.01)

    def stop_pod(self, pod: dict, grace: int) -> None:
        self.events.append((self.now, f"stop {pod['metadata']['name']} grace={grace}"))
        self.stopping[pod["metadata"]["uid"]] = self.now

    def pod_stopped(self, uid: str) -> bool:
        name = uid.removeprefix("uid-")
        return uid in self.stopping and self.now - self.stopping[uid] >= self.stop_after.get(name, 0.0)

    async def report_not_ready(self) -> None:
        self.events.append((self.now, "NotReady"))

    async def flush(self, timeout: float) -> None:
        self.events.append((self.now, f"flush within {timeout:.1f}s"))

    def manager(self, grace: float, critical: float, **inhibitor) -> ShutdownManager:
        return ShutdownManager(ShutdownConfig(grace, critical), active_pods=lambda: self.pods, is_critical=is_critical,
                               stop_pod=self.stop_pod, pod_stopped=self.pod_stopped,
                               report_not_ready=self.report_not_ready, flush_statuses=self.flush,
                               clock=lambda: self.now, sleep=self.sleep, **inhibitor)


async def test_regular_pods_then_critical_pods_within_their_budgets():
    node = FakeNode([pod("dns", critical=True), pod("web", grace=30), pod("batch", grace=2)],
                    stop_after={"web": 100.0, "batch": 1.0, "dns": 0.5})  # web ignores SIGTERM
    manager = node.manager(20, 5)
    assert manager.health() == (True, "ok") and manager.admit(pod("new")).admit
    await manager.shutdown()

    assert manager.health() == (False, NOT_READY_MESSAGE)
    assert manager.admit(pod("new")).reason == ADMIT_REASON
    steps = [what for _, what in node.events]
    assert steps == ["NotReady", "stop web grace=15", "stop batch grace=2", "stop dns grace=5",
                     steps[-1]] and steps[-1].startswith("flush")
    times = dict((what, at) for at, what in node.events)
    # The regular group waited its whole 15 s budget (web never stopped), not a second more.
    assert 15.0 <= times["stop dns grace=5"] < 15.3
    # The critical group ended as soon as dns stopped; the statuses get what is left of the 20 s.
    assert times[steps[-1]] < 16.0
    assert float(steps[-1].split()[-1][:-1]) == pytest.approx(20 - times[steps[-1]], abs=0.01)


async def test_a_group_ends_when_its_pods_stopped():
    node = FakeNode([pod("web"), pod("dns", critical=True)], stop_after={"web": 1.0, "dns": 1.0})
    await node.manager(60, 30).shutdown()
    times = dict((what, at) for at, what in node.events)
    assert 1.0 <= times["stop dns grace=30"] < 1.5


async def test_unreachable_api_does_not_hold_up_the_pods():
    node = FakeNode([pod("web")], stop_after={})

    async def unreachable() -> None:
        raise ConnectionError("no route")

    manager = node.manager(10, 0)
    manager._report_not_ready = unreachable
    await manager.shutdown()
    assert [what for _, what in node.events][0] == "stop web grace=10"


# -- without logind --------------------------------------------------------------------------------------

NO_BUS = FileNotFoundError(2, "No such file or directory")
LOST = ConnectionError("the system bus connection was lost")


class ScriptedInhibitor:
    """One connection attempt: `start` raises `fails_with`, else it arms and hands out `signals` in turn (an
    exception is raised); past the end of the script it waits for ever, `waiting` set."""

    def __init__(self, fails_with: BaseException | None = None, signals: tuple = ()):
        self.fails_with = fails_with
        self.signals = list(signals)
        self.waiting = asyncio.Event()
        self.closed = False

    async def start(self, loop) -> None:
        if self.fails_with is not None:
            raise self.fails_with

    def delay_max_seconds(self) -> float:
        return 3600.0

    async def next_prepare_for_shutdown(self) -> bool:
        if not self.signals:
            self.waiting.set()
            await asyncio.Event().wait()
        signal = self.signals.pop(0)
        if isinstance(signal, BaseException):
            raise signal
        return signal

    def take(self) -> None:
        pass

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


async def run_script(node: FakeNode, attempts: list[ScriptedInhibitor]) -> None:
    """Runs the manager over the attempts until the last one is armed and waiting; every attempt was closed."""
    script = iter(attempts)
    task = asyncio.create_task(node.manager(10, 0, inhibitor=lambda: next(script)).run())
    await asyncio.wait_for(attempts[-1].waiting.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(attempt.closed for attempt in attempts)


def retry_lines(caplog) -> list[tuple[str, str]]:
    """What the inhibitor loop said about logind being there or not (not its "armed" line)."""
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "edgelet.lifecycle.shutdown"
            and r.getMessage().startswith("graceful node shutdown (") and r.levelno >= logging.INFO]


async def test_a_missing_logind_is_said_once_per_streak_and_its_recovery_once(caplog):
    caplog.set_level(logging.DEBUG)
    node = FakeNode([], stop_after={})
    await run_script(node, [ScriptedInhibitor(NO_BUS) for _ in range(3)] + [ScriptedInhibitor(signals=(LOST,))] +
                     [ScriptedInhibitor(NO_BUS) for _ in range(2)] + [ScriptedInhibitor()])
    lines = retry_lines(caplog)
    assert [level for level, _ in lines] == ["WARNING", "INFO", "WARNING", "INFO"], lines
    assert lines[0][1].startswith("graceful node shutdown (system bus / systemd-logind): unavailable ([Errno 2] No "
                                  "such file or directory); pods run on, unprotected from power-off, retrying in ")
    assert lines[1][1].endswith("working again after 3 failed attempts")
    assert "unavailable (the system bus connection was lost)" in lines[2][1]
    assert lines[3][1].endswith("working again after 3 failed attempts")
    # 1 s doubling up to 60 s, full jitter; the second streak starts over.
    assert len(node.slept) == 6 and all(0 <= d <= c for d, c in zip(node.slept, (1, 2, 4, 1, 2, 4)))


async def test_the_bus_going_away_after_the_shutdown_is_no_warning(caplog):
    caplog.set_level(logging.DEBUG)
    node = FakeNode([pod("web")], stop_after={})
    await run_script(node, [ScriptedInhibitor(signals=(True, LOST)), ScriptedInhibitor(NO_BUS), ScriptedInhibitor()])
    assert "stop web grace=10" in [what for _, what in node.events]
    assert [level for level, _ in retry_lines(caplog)] == ["INFO", "INFO"]


def test_shutdown_words_are_the_kubelets():
    assert (REASON, MESSAGE) == ("Terminated", "Pod was terminated in response to imminent node shutdown.")


@pytest.mark.parametrize("table, ok", [
    ({}, True),
    ({"grace_period": "30s", "critical_pods_grace_period": "10s"}, True),
    ({"grace_period": "10s", "critical_pods_grace_period": "30s"}, False),
    ({"grace_period": "-1s"}, False),
])
def test_shutdown_settings(table, ok):
    if ok:
        config = parse_config({"node_name": "n", "shutdown": table})
        assert config.shutdown.enabled == bool(table)
    else:
        with pytest.raises(ConfigError) as error:
            parse_config({"node_name": "n", "shutdown": table})
        assert error.value.key.startswith("shutdown.")
