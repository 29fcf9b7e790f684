"""Graceful node shutdown: which pods stop in which group with which grace, and the order and budgets
the manager keeps (fake clock; the D-Bus side is tested under systemd in tests/package)."""

from __future__ import annotations

import pytest

from edgelet.config import ShutdownConfig, parse_config
from edgelet.errors import ConfigError
from edgelet.eviction.policy import is_critical
from edgelet.shutdown import ADMIT_REASON, MESSAGE, NOT_READY_MESSAGE, REASON, ShutdownManager, plan_shutdown


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

    async def sleep(self, seconds: float) -> None:
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

    def manager(self, grace: float, critical: float) -> ShutdownManager:
        return ShutdownManager(ShutdownConfig(grace, critical), active_pods=lambda: self.pods, is_critical=is_critical,
                               stop_pod=self.stop_pod, pod_stopped=self.pod_stopped,
                               report_not_ready=self.report_not_ready, flush_statuses=self.flush,
                               clock=lambda: self.now, sleep=self.sleep)


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
