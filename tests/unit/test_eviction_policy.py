"""The eviction decisions with synthetic signals and usage: thresholds, conditions with their transition
period, the resource to reclaim, pod ranking, the kubelet's messages and admission under pressure."""

import pytest

from edgelet.config import Threshold
from edgelet.eviction import policy
from edgelet.eviction.signals import Observation
from edgelet.eviction.usage import ContainerUsage, PodUsage
from tests.helpers import resource_pod

Mi = 2**20
Gi = 2**30


def t(text):
    return Threshold.parse(text)


# -- thresholds ------------------------------------------------------------------------------------

@pytest.mark.parametrize("threshold, capacity, expected", [
    ("100Mi", 10 * Gi, 100 * Mi), ("10%", 1000, 100), ("15%", 999, 149), ("100%", 7, 7),
])
def test_threshold_quantity(threshold, capacity, expected):
    assert policy.threshold_quantity(t(threshold), capacity) == expected


THRESHOLDS = {"memory.available": t("100Mi"), "nodefs.available": t("10%"), "pid.available": t("5%")}


@pytest.mark.parametrize("case, observations, expected", [
    ("all fine", {"memory.available": Observation(200 * Mi, Gi), "nodefs.available": Observation(500, 1000)}, []),
    ("memory below", {"memory.available": Observation(99 * Mi, Gi)}, ["memory.available"]),
    ("exactly at the threshold is not below", {"memory.available": Observation(100 * Mi, Gi)}, []),
    ("percentage below", {"nodefs.available": Observation(99, 1000)}, ["nodefs.available"]),
    ("percentage at", {"nodefs.available": Observation(100, 1000)}, []),
    ("unobserved signals are skipped", {"imagefs.available": Observation(0, 1000)}, []),
    ("several", {"memory.available": Observation(0, Gi), "pid.available": Observation(10, 1000)},
     ["memory.available", "pid.available"]),
])
def test_thresholds_met(case, observations, expected):
    assert policy.thresholds_met(THRESHOLDS, observations) == expected


@pytest.mark.parametrize("signals, conditions", [
    ([], set()),
    (["memory.available"], {"MemoryPressure"}),
    (["nodefs.inodesFree", "imagefs.available", "containerfs.available"], {"DiskPressure"}),
    (["pid.available", "memory.available"], {"PIDPressure", "MemoryPressure"}),
])
def test_node_conditions(signals, conditions):
    assert policy.node_conditions(signals) == conditions


def run_conditions(period, timeline):
    """[(now, signals met)] -> the conditions in effect after each step."""
    last, seen = {}, []
    for now, met in timeline:
        last = policy.conditions_last_observed(last, policy.node_conditions(met), now)
        seen.append(policy.conditions_in_effect(last, period, now))
    return seen


def test_pressure_holds_for_the_transition_period_after_the_last_observation():
    memory = ["memory.available"]
    seen = run_conditions(300, [(0, memory), (10, memory), (20, []), (309, []), (310, []), (311, memory)])
    assert seen == [{"MemoryPressure"}, {"MemoryPressure"}, {"MemoryPressure"}, {"MemoryPressure"}, set(),
                    {"MemoryPressure"}]


def test_zero_transition_period_follows_the_signal():
    seen = run_conditions(0, [(0, ["nodefs.available"]), (1, []), (2, ["pid.available"])])
    assert seen == [{"DiskPressure"}, set(), {"PIDPressure"}]


def test_pressure_flags_use_node_status_keys():
    assert policy.pressure_flags({"DiskPressure"}) == {"memory": False, "disk": True, "pid": False}


@pytest.mark.parametrize("met, expected", [
    ([], None),
    (["nodefs.available", "memory.available"], "memory.available"),
    (["pid.available", "imagefs.inodesFree"], "imagefs.inodesFree"),
    (["pid.available"], "pid.available"),
])
def test_signal_to_reclaim_ranks_memory_first(met, expected):
    assert policy.signal_to_reclaim(met) == expected


def test_shortfall():
    assert policy.shortfall(t("10%"), Observation(60, 1000)) == 40
    assert policy.shortfall(t("100Mi"), Observation(200 * Mi, Gi)) == 0


# -- pods --------------------------------------------------------------------------------------------

def mem(value):
    return PodUsage({"app": ContainerUsage(memory=value, disk=0, inodes=0)})


def names(pods):
    return [p["metadata"]["name"] for p in pods]


def test_memory_ranking_like_the_kubelet():
    pods = [
        resource_pod("under-request", memory_request="200Mi"),
        resource_pod("high-priority-over", priority=1000),
        resource_pod("best-effort"),
        resource_pod("no-stats"),
        resource_pod("far-over-request", memory_request="10Mi"),
    ]
    usage = {"under-request": mem(100 * Mi), "high-priority-over": mem(500 * Mi), "best-effort": mem(50 * Mi),
             "far-over-request": mem(300 * Mi)}
    assert names(policy.rank_pods("memory.available", pods, usage)) == [
        "no-stats", "far-over-request", "best-effort", "high-priority-over", "under-request"]


def disk(value, inodes=0):
    return PodUsage({"app": ContainerUsage(disk=value, inodes=inodes)})


def test_disk_ranking_by_usage_above_ephemeral_storage_requests():
    pods = [resource_pod("small"), resource_pod("requested-big", storage_request="1Gi"), resource_pod("big")]
    usage = {"small": disk(10 * Mi), "requested-big": disk(900 * Mi), "big": disk(500 * Mi)}
    assert names(policy.rank_pods("nodefs.available", pods, usage)) == ["big", "small", "requested-big"]


def test_inode_ranking_by_inodes_used():
    pods = [resource_pod("few"), resource_pod("many")]
    usage = {"few": disk(Gi, inodes=10), "many": disk(Mi, inodes=10_000)}
    assert names(policy.rank_pods("nodefs.inodesFree", pods, usage)) == ["many", "few"]


def test_pid_ranking_priority_then_processes():
    def procs(n):
        return PodUsage({"app": ContainerUsage(processes=n)})

    pods = [resource_pod("important", priority=10), resource_pod("few"), resource_pod("many")]
    usage = {"important": procs(1000), "few": procs(2), "many": procs(300)}
    assert names(policy.rank_pods("pid.available", pods, usage)) == ["many", "few", "important"]


@pytest.mark.parametrize("pod, critical", [
    (resource_pod("api"), False),
    (resource_pod("static", source="file"), True),
    (resource_pod("http", source="http"), True),
    (resource_pod("system", priority=2_000_000_000), True),
    (resource_pod("high", priority=1_999_999_999), False),
])
def test_critical_pods(pod, critical):
    assert policy.is_critical(pod) is critical


@pytest.mark.parametrize("resource, pod, expected", [
    ("memory", resource_pod("p", memory_request="64Mi"), 64 * Mi),
    ("memory", resource_pod("p", memory_limit="128Mi"), 128 * Mi),  # the limit stands in for the request
    ("ephemeral-storage", resource_pod("p"), 0),
])
def test_pod_request(resource, pod, expected):
    assert policy.pod_request(pod, resource) == expected


def test_pod_request_takes_the_larger_of_containers_and_init():
    pod = resource_pod("p", memory_request="64Mi")
    pod["spec"]["initContainers"] = [{"name": "init", "image": "b", "resources": {"requests": {"memory": "1Gi"}}}]
    assert policy.pod_request(pod, "memory") == Gi


@pytest.mark.parametrize("init, expected", [
    ([("sidecar", "100Mi", True)], 164 * Mi),  # a sidecar runs beside the app: the sum
    ([("sidecar", "100Mi", True), ("setup", "80Mi", False)], 180 * Mi),  # setup runs beside the sidecar
    ([("setup", "80Mi", False), ("sidecar", "100Mi", True)], 164 * Mi),  # setup ran before it
])
def test_pod_request_with_sidecars(init, expected):
    pod = resource_pod("p", memory_request="64Mi")
    pod["spec"]["initContainers"] = [
        {"name": name, "image": "b", "resources": {"requests": {"memory": memory}},
         **({"restartPolicy": "Always"} if sidecar else {})} for name, memory, sidecar in init]
    assert policy.pod_request(pod, "memory") == expected


# -- messages and status -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, binary, text", [
    (100 * Mi, True, "100Mi"), (0, True, "0"), (1000, True, "1000"), (81920 * 1024, True, "80Mi"),
    (3 * 1024, True, "3Ki"), (1000, False, "1k"), (1234, False, "1234"), (5 * 10**6, False, "5M"),
])
def test_format_quantity(value, binary, text):
    assert policy.format_quantity(value, binary) == text


def test_memory_eviction_message_names_the_containers_over_their_request():
    pod = resource_pod("web", memory_request="64Mi")
    pod["spec"]["containers"].append({"name": "sidecar", "image": "b"})
    pod["spec"]["containers"].append({"name": "quiet", "image": "b", "resources": {"requests": {"memory": "1Gi"}}})
    usage = PodUsage({"app": ContainerUsage(memory=200 * Mi), "sidecar": ContainerUsage(memory=10 * Mi),
                      "quiet": ContainerUsage(memory=Mi)})
    message = policy.eviction_message("memory.available", pod, usage, t("100Mi"), Observation(80 * Mi, Gi))
    assert message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
        "Container app was using 200Mi, request is 64Mi, has larger consumption of memory. "
        "Container sidecar was using 10Mi, request is 0, has larger consumption of memory. ")


def test_disk_and_inode_messages():
    pod = resource_pod("web")
    usage = PodUsage({"app": ContainerUsage(disk=3 * Mi)})
    assert policy.eviction_message("nodefs.available", pod, usage, t("10%"), Observation(5 * Gi, 100 * Gi)) == (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. "
        "Container app was using 3Mi, request is 0, has larger consumption of ephemeral-storage. ")
    assert policy.eviction_message("nodefs.inodesFree", pod, usage, t("5%"), Observation(1000, 1_000_000)) == (
        "The node was low on resource: inodes. Threshold quantity: 50000, available: 1k. ")


def test_message_without_stats_has_no_container_part():
    message = policy.eviction_message("memory.available", resource_pod("p"), None, t("100Mi"), Observation(Mi, Gi))
    assert message == "The node was low on resource: memory. Threshold quantity: 100Mi, available: 1Mi. "


def test_evicted_status():
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.5"}
    result = policy.evicted_status(status, "The node was low on resource: memory. ", "2024-01-01T00:00:00Z")
    assert result["phase"] == "Failed" and result["reason"] == "Evicted"
    assert result["message"] == "The node was low on resource: memory. " and result["podIP"] == "10.0.0.5"
    assert result["conditions"][-1] == {
        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
        "message": "The node was low on resource: memory. ", "lastTransitionTime": "2024-01-01T00:00:00Z"}
    again = policy.evicted_status(result, "later", "2024-01-01T00:05:00Z")
    assert again["conditions"][-1]["lastTransitionTime"] == "2024-01-01T00:00:00Z"
    assert sum(c["type"] == "DisruptionTarget" for c in again["conditions"]) == 1
    assert status["phase"] == "Running"  # the input is not modified


# -- admission -------------------------------------------------------------------------------------------------

BEST_EFFORT = resource_pod("be")
BURSTABLE = resource_pod("bu", memory_request="10Mi")
GUARANTEED = resource_pod("gu", memory_request="10Mi", memory_limit="10Mi", cpu="1")
REJECTED_MEMORY = (False, "Evicted", "The node had condition: [MemoryPressure]. ")


@pytest.mark.parametrize("case, conditions, pod, expected", [
    ("no pressure", set(), BEST_EFFORT, (True, "", "")),
    ("memory pressure rejects BestEffort", {"MemoryPressure"}, BEST_EFFORT, REJECTED_MEMORY),
    ("memory pressure admits Burstable", {"MemoryPressure"}, BURSTABLE, (True, "", "")),
    ("memory pressure admits Guaranteed", {"MemoryPressure"}, GUARANTEED, (True, "", "")),
    ("toleration of the memory-pressure taint", {"MemoryPressure"},
     resource_pod("t", tolerations=[{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists",
                                 "effect": "NoSchedule"}]), (True, "", "")),
    ("toleration of everything", {"MemoryPressure"}, resource_pod("t", tolerations=[{"operator": "Exists"}]),
     (True, "", "")),
    ("toleration of another taint does not help", {"MemoryPressure"},
     resource_pod("t", tolerations=[{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists"}]),
     REJECTED_MEMORY),
    ("disk pressure rejects everyone", {"DiskPressure"}, GUARANTEED,
     (False, "Evicted", "The node had condition: [DiskPressure]. ")),
    ("two conditions", {"DiskPressure", "MemoryPressure"}, BURSTABLE,
     (False, "Evicted", "The node had condition: [MemoryPressure DiskPressure]. ")),
    ("critical pods always", {"DiskPressure", "PIDPressure"}, resource_pod("s", source="file"), (True, "", "")),
])
def test_admit(case, conditions, pod, expected):
    assert policy.admit(conditions, pod) == expected


@pytest.mark.parametrize("signal, threshold, text", [
    ("memory.available", "100Mi", "100Mi"), ("nodefs.available", "10%", "10%"), ("nodefs.inodesFree", "5000", "5k"),
    ("imagefs.available", "12.5%", "12.5%"),
])
def test_threshold_text(signal, threshold, text):
    assert policy.threshold_text(signal, t(threshold)) == text
