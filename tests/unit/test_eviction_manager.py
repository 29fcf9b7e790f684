"""The eviction manager's passes over scripted signals and usage (stand-ins for the /proc and cgroup
readers): pressure, admission, node-level reclaim before evictions, one eviction per pass, critical pods,
cleanup waits and the evictions metric."""

import logging

import pytest

from edgelet.config import Threshold
from edgelet.eviction.manager import Collaborators, EvictionManager
from edgelet.eviction.signals import Observation
from edgelet.eviction.usage import ContainerUsage, PodUsage
from edgelet.metrics import registry as metrics
from tests.helpers import resource_pod

Mi = 2**20
Gi = 2**30


class ScriptedSignals:
    """Returns the queued observations in turn, repeating the last one."""

    def __init__(self, *observations, dedicated_image_fs=False):
        self.queue = list(observations)
        self.dedicated_image_fs = dedicated_image_fs
        self.calls = 0

    async def observe(self):
        self.calls += 1
        return self.queue.pop(0) if len(self.queue) > 1 else self.queue[0]


class StaticUsage:
    def __init__(self, usage):
        self.by_uid = usage

    async def usage(self, pods):
        return {uid: value for uid, value in self.by_uid.items() if uid in {p["metadata"]["uid"] for p in pods}}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


LOW_MEMORY = {"memory.available": Observation(50 * Mi, Gi), "nodefs.available": Observation(500 * Gi, 1000 * Gi)}
PLENTY = {"memory.available": Observation(900 * Mi, Gi), "nodefs.available": Observation(500 * Gi, 1000 * Gi)}
THRESHOLDS = {"memory.available": Threshold.parse("100Mi"), "nodefs.available": Threshold.parse("10%"),
              "imagefs.available": Threshold.parse("15%")}


def make_manager(signals, pods, usage=None, **kwargs):
    evicted = []

    async def evict(pod, reason, message, grace):
        evicted.append((pod["metadata"]["name"], reason, message, grace))

    collaborators = Collaborators(
        signals=signals, usage=StaticUsage(usage or {}),
        active_pods=lambda: [p for p in pods if p["metadata"]["name"] not in {e[0] for e in evicted}], evict=evict,
        **{name: kwargs.pop(name) for name in ("pod_cleaned_up", "reclaim_images", "reclaim_containers")
           if name in kwargs})
    manager = EvictionManager(kwargs.pop("thresholds", THRESHOLDS), collaborators, **kwargs)
    return manager, evicted


async def test_memory_pressure_evicts_the_best_effort_pod_first_and_one_per_pass():
    pods = [resource_pod("guarded", memory_request="500Mi"), resource_pod("best-effort")]
    usage = {"guarded": PodUsage({"app": ContainerUsage(memory=300 * Mi)}),
             "best-effort": PodUsage({"app": ContainerUsage(memory=40 * Mi)})}
    manager, evicted = make_manager(ScriptedSignals(LOW_MEMORY), pods, usage)
    before = metrics.evictions.labels("memory.available").value

    assert (await manager.synchronize())["metadata"]["name"] == "best-effort"
    assert evicted == [("best-effort", "Evicted",
                        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
                        "Container app was using 40Mi, request is 0, has larger consumption of memory. ", 1)]
    assert manager.pressure() == {"memory": True, "disk": False, "pid": False}
    assert manager.admit(resource_pod("new-best-effort"))[0] is False
    assert manager.admit(resource_pod("new-burstable", memory_request="1Mi"))[0] is True
    assert metrics.evictions.labels("memory.available").value == before + 1

    await manager.synchronize()
    assert [e[0] for e in evicted] == ["best-effort", "guarded"]


async def test_pressure_outlasts_recovery_by_the_transition_period():
    clock = Clock()
    manager, evicted = make_manager(ScriptedSignals(LOW_MEMORY, PLENTY), [], clock=clock,
                                    pressure_transition_period=300)
    await manager.synchronize()
    clock.now += 299
    await manager.synchronize()
    assert manager.pressure()["memory"] is True
    clock.now += 1
    await manager.synchronize()
    assert manager.pressure()["memory"] is False and evicted == []


async def test_image_pressure_is_relieved_by_reclaiming_images_without_evicting():
    full = {"imagefs.available": Observation(100 * Gi, 1000 * Gi)}
    relieved = {"imagefs.available": Observation(300 * Gi, 1000 * Gi)}
    asked, order = [], []

    async def reclaim_images(amount):
        asked.append(amount)
        order.append("images")
        return amount

    async def reclaim_containers():
        order.append("containers")

    manager, evicted = make_manager(ScriptedSignals(full, relieved), [resource_pod("p")],
                                    reclaim_images=reclaim_images, reclaim_containers=reclaim_containers)
    assert await manager.synchronize() is None
    assert asked == [50 * Gi]  # back to 15 % of 1000 Gi
    assert order == ["containers", "images"] and evicted == []
    assert manager.pressure()["disk"] is True  # observed this pass: the condition stands


async def test_reclaim_that_does_not_help_is_followed_by_an_eviction():
    full = {"nodefs.available": Observation(10 * Gi, 1000 * Gi)}

    async def reclaim_images(amount):
        return 0

    manager, evicted = make_manager(ScriptedSignals(full), [resource_pod("p")], reclaim_images=reclaim_images,
                                    usage={"p": PodUsage({"app": ContainerUsage(disk=Mi)})})
    assert (await manager.synchronize())["metadata"]["name"] == "p"
    assert evicted[0][2].startswith("The node was low on resource: ephemeral-storage. "
                                    "Threshold quantity: 100Gi, available: 10Gi. ")


async def test_nodefs_pressure_skips_image_gc_when_images_live_elsewhere():
    asked = []

    async def reclaim_images(amount):
        asked.append(amount)
        return amount

    signals = ScriptedSignals({"nodefs.available": Observation(10 * Gi, 1000 * Gi)}, dedicated_image_fs=True)
    manager, evicted = make_manager(signals, [resource_pod("p")], reclaim_images=reclaim_images)
    await manager.synchronize()
    assert asked == [] and [e[0] for e in evicted] == ["p"]


async def test_critical_pods_are_never_evicted():
    pods = [resource_pod("static", source="file"), resource_pod("api")]
    manager, evicted = make_manager(ScriptedSignals(LOW_MEMORY), pods)
    assert (await manager.synchronize())["metadata"]["name"] == "api"
    assert await manager.synchronize() is None
    assert [e[0] for e in evicted] == ["api"]
    assert manager.admit(resource_pod("another-static", source="file"))[0] is True


async def test_no_thresholds_no_work():
    signals = ScriptedSignals(LOW_MEMORY)
    manager, evicted = make_manager(signals, [resource_pod("p")], thresholds={})
    assert await manager.synchronize() is None and signals.calls == 0


def test_unobserved_signals_are_reported_once(caplog):
    with caplog.at_level(logging.WARNING):
        make_manager(ScriptedSignals(PLENTY), [], thresholds={"allocatableMemory.available": Threshold.parse("1Mi")})
    assert "allocatableMemory.available is not observed" in caplog.text


class Stop(Exception):
    pass


async def test_run_waits_for_the_evicted_pod_to_be_cleaned_up_then_for_the_interval():
    cleaned = {"best-effort": False}
    sleeps = []

    async def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            cleaned["best-effort"] = True
        if len(sleeps) > 4:
            raise Stop

    manager, evicted = make_manager(ScriptedSignals(LOW_MEMORY, PLENTY), [resource_pod("best-effort")],
                                    sleep=sleep, pod_cleaned_up=lambda uid: cleaned[uid])
    with pytest.raises(Stop):
        await manager.run()
    # three 1 s cleanup polls (clean at the third), then the 10 s monitoring interval between quiet passes
    assert sleeps == [1.0, 1.0, 1.0, 10.0, 10.0]
    assert [e[0] for e in evicted] == ["best-effort"]


async def test_the_critical_rule_can_be_replaced():
    manager, evicted = make_manager(ScriptedSignals(LOW_MEMORY), [resource_pod("static", source="file")],
                                    is_critical=lambda pod: False)
    assert (await manager.synchronize())["metadata"]["name"] == "static"
    assert manager.admit(resource_pod("static-best-effort", source="file"))[0] is False
