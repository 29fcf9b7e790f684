"""In-place resize decisions: what differs, whether the node can take it, what restarts, what the status shows."""

from __future__ import annotations

import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus
from edgelet.kuberuntime.resize import (
    Applied,
    applied_resources,
    desired_applied,
    feasibility,
    format_memory,
    plan_resize,
    pod_requests,
)
from edgelet.kuberuntime.resizer import ResizeView
from edgelet.status.extras import add_newer_fields

MiB = 1 << 20
NODE = (2000, 4096 * MiB)  # 2 CPUs, 4 GiB allocatable


def pod(resources, resize_policy=None, name="main"):
    container = {"name": name, "image": "busybox", "resources": resources}
    if resize_policy:
        container["resizePolicy"] = resize_policy
    return {"metadata": {"name": "web", "namespace": "default", "uid": "u-1"}, "spec": {"containers": [container]}}


def running(container_id="c1", name="main"):
    return PodRuntimeStatus(uid="u-1", containers=[ContainerStatus(
        id=container_id, name=name, sandbox_id="s", state=ContainerState.RUNNING, created_at=1)])


SMALL = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
BIG = {"requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}
SMALL_APPLIED = Applied(102, 20000, 64 * MiB)


def test_the_cgroup_settings_a_spec_asks_for():
    assert desired_applied(pod(SMALL), pod(SMALL)["spec"]["containers"][0]) == SMALL_APPLIED
    assert desired_applied(pod(BIG), pod(BIG)["spec"]["containers"][0]) == Applied(512, 100000, 128 * MiB)
    assert desired_applied(pod({}), {"name": "main"}) == Applied(2, 0, 0)


def test_nothing_to_do_when_the_cgroup_holds_the_spec():
    assert plan_resize(pod(SMALL), running(), {"c1": SMALL_APPLIED}, others=(0, 0), allocatable=NODE).changes == ()
    # A container the runtime says nothing about is left alone, as is one that is not running.
    assert plan_resize(pod(BIG), running(), {}, others=(0, 0), allocatable=NODE).changes == ()


@pytest.mark.parametrize(
    ("policy", "restart"),
    [
        (None, False),
        ([{"resourceName": "cpu", "restartPolicy": "NotRequired"}], False),
        ([{"resourceName": "memory", "restartPolicy": "RestartContainer"}], True),  # memory changes too
        ([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}], True),
    ],
)
def test_a_changed_spec_is_applied_in_place_unless_its_policy_restarts(policy, restart):
    plan = plan_resize(pod(BIG, policy), running(), {"c1": SMALL_APPLIED}, others=(0, 0), allocatable=NODE)
    assert plan.accepted
    [change] = plan.changes
    assert (change.desired, change.applied, change.restart) == (Applied(512, 100000, 128 * MiB), SMALL_APPLIED, restart)


def test_only_the_cpu_changes_so_a_memory_restart_policy_does_not_restart():
    cpu_only = {"requests": {"cpu": "500m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    plan = plan_resize(pod(cpu_only, [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]), running(),
                       {"c1": SMALL_APPLIED}, others=(0, 0), allocatable=NODE)
    assert [c.restart for c in plan.changes] == [False]


@pytest.mark.parametrize(
    ("requested", "others", "verdict"),
    [
        ((500, 64 * MiB), (1000, 0), None),
        ((3000, 64 * MiB), (0, 0),
         ("Infeasible", "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000")),
        ((500, 8192 * MiB), (0, 0), ("Infeasible", f"Node didn't have enough capacity: memory, requested: "
                                                  f"{8192 * MiB}, capacity: {4096 * MiB}")),
        ((1500, 64 * MiB), (1000, 0),
         ("Deferred", "Node didn't have enough resource: cpu, requested: 1500, used: 1000, "
                                                  "capacity: 2000")),
    ],
)
def test_feasibility(requested, others, verdict):
    assert feasibility(requested, others, NODE) == verdict


def test_the_other_pods_are_summed_only_for_a_change_to_fit():
    calls: list[int] = []

    def others() -> tuple[int, int]:
        calls.append(1)
        return (1800, 0)

    assert plan_resize(pod(SMALL), running(), {"c1": SMALL_APPLIED}, others=others, allocatable=NODE).changes == ()
    assert calls == []  # an unchanged pod (every periodic resync) never walks the other pods
    plan = plan_resize(pod(BIG), running(), {"c1": SMALL_APPLIED}, others=others, allocatable=NODE)
    assert calls == [1] and plan.pending[0] == "Deferred"


def test_a_pending_resize_applies_nothing():
    plan = plan_resize(pod(BIG), running(), {"c1": SMALL_APPLIED}, others=(1800, 0), allocatable=NODE)
    assert not plan.accepted and plan.pending[0] == "Deferred"


def test_a_memory_limit_below_what_the_container_uses_is_deferred():
    plan = plan_resize(pod(SMALL), running(), {"c1": Applied(512, 100000, 128 * MiB)}, others=(0, 0),
                       allocatable=NODE, memory_usage={"c1": 100 * MiB})
    assert plan.pending == ("Deferred", f"container main: memory limit ({64 * MiB}) below current usage ({100 * MiB})")
    plan = plan_resize(pod(SMALL), running(), {"c1": Applied(512, 100000, 128 * MiB)}, others=(0, 0),
                       allocatable=NODE, memory_usage={"c1": 10 * MiB})
    assert plan.accepted
    # With RestartContainer for memory the restart frees it: not deferred.
    plan = plan_resize(pod(SMALL, [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]), running(),
                       {"c1": Applied(512, 100000, 128 * MiB)}, others=(0, 0), allocatable=NODE,
                       memory_usage={"c1": 100 * MiB})
    assert plan.accepted


def test_pod_requests_take_the_larger_of_regular_sum_and_init_containers():
    spec = pod(SMALL)
    spec["spec"]["containers"].append({"name": "b", "resources": {"limits": {"cpu": "300m"}}})
    spec["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"memory": "1Gi"}}}]
    assert pod_requests(spec) == (400, 1024 * MiB)


@pytest.mark.parametrize(
    ("allocated", "applied", "shown"),
    [
        (SMALL, SMALL_APPLIED,
         {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}),
        # Mid-resize: the cgroup still holds the old values, and that is what the status says.
        (BIG, SMALL_APPLIED,
         {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}),
        (BIG, None, BIG),  # nothing reported: the allocation
        # A memory-only request: the kernel's minimum CPU shares do not turn into a CPU request.
        ({"requests": {"memory": "32Mi"}}, Applied(2, 0, 0), {"requests": {"memory": "32Mi"}}),
        ({}, Applied(2, 0, 0), {}),
    ],
)
def test_the_status_shows_what_the_cgroup_holds_over_the_allocation(allocated, applied, shown):
    assert applied_resources(allocated, applied) == shown


def test_format_memory_as_binary_si():
    assert [format_memory(v) for v in (64 * MiB, 1536 * 1024, 1000000, 1 << 30)] == ["64Mi", "1536Ki", "1000000", "1Gi"]


def test_the_status_carries_allocated_and_applied_resources_and_the_resize_conditions():
    status = {"conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "main", "containerID": "containerd://c1", "state": {"running": {}}}]}
    view = ResizeView(allocated={"main": SMALL}, applied={"c1": SMALL_APPLIED}, conditions=(
        {"type": "PodResizePending", "status": "True", "reason": "Deferred", "message": "m"},))
    result = add_newer_fields(status, {"metadata": {"generation": 2}}, running(), view)
    [item] = result["containerStatuses"]
    assert item["allocatedResources"] == SMALL["requests"]
    assert item["resources"] == SMALL
    assert [(c["type"], c.get("observedGeneration")) for c in result["conditions"]] == [
        ("Ready", 2), ("PodResizePending", 2)]


def test_the_pod_cgroup_holds_old_and_new_limits_while_containers_change():
    from edgelet.cm.cgroups import CgroupResources, widest

    old = CgroupResources(cpu_shares=102, cpu_quota=20000, cpu_period=100000, memory_limit=64 * MiB)
    new = CgroupResources(cpu_shares=307, cpu_quota=10000, cpu_period=100000, memory_limit=96 * MiB)
    assert widest(old, new) == CgroupResources(cpu_shares=307, cpu_quota=20000, cpu_period=100000,
                                               memory_limit=96 * MiB)
    unlimited = CgroupResources(cpu_shares=2)
    assert widest(old, unlimited) == CgroupResources(cpu_shares=102, cpu_quota=-1, cpu_period=None, memory_limit=None)


def test_a_guaranteed_pod_under_the_static_cpu_policy_is_not_resized():
    guaranteed = {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    bigger = {"requests": {"cpu": "2", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "64Mi"}}
    applied = {"c1": desired_applied(pod(guaranteed), pod(guaranteed)["spec"]["containers"][0])}
    plan = plan_resize(pod(bigger), running(), applied, others=(0, 0), allocatable=(4000, 4096 * MiB),
                       static_cpu_policy=True)
    assert plan.pending == ("Infeasible",
                            "Resize is infeasible for Guaranteed Pods alongside CPU Manager static policy")
    # Burstable pods, and any pod under the none policy, are resized.
    assert plan_resize(pod(bigger), running(), applied, others=(0, 0), allocatable=(4000, 4096 * MiB)).accepted
    assert plan_resize(pod(BIG), running(), {"c1": SMALL_APPLIED}, others=(0, 0), allocatable=NODE,
                       static_cpu_policy=True).accepted
