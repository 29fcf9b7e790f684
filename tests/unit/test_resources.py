"""Container cgroup settings against the kubelet's numbers: shares, quota, memory limit, OOM score."""

from __future__ import annotations

import pytest

from edgelet.api.podutil import CONFIG_SOURCE_ANNOTATION
from edgelet.api.resources import (
    ResourceError,
    linux_resources,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    oom_score_adj,
    pod_memory_limit,
)

GI = 1 << 30
CAPACITY = 4 * GI


@pytest.mark.parametrize(
    ("milli", "shares"),
    [(0, 2), (1, 2), (2, 2), (5, 5), (100, 102), (250, 256), (1000, 1024), (1500, 1536),
     (256000, 262144), (300000, 262144)],
)
def test_milli_cpu_to_shares(milli, shares):
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "period", "quota"),
    [(0, 100000, 0), (5, 100000, 1000), (9, 100000, 1000), (10, 100000, 1000), (11, 100000, 1100),
     (200, 100000, 20000), (500, 100000, 50000), (1000, 100000, 100000), (1500, 100000, 150000),
     (500, 50000, 25000)],
)
def test_milli_cpu_to_quota(milli, period, quota):
    assert milli_cpu_to_quota(milli, period) == quota


def _pod(*containers, init=(), annotations=None, **spec):
    return {"metadata": {"name": "p", "uid": "u", "annotations": annotations or {}},
            "spec": {"containers": list(containers), "initContainers": list(init), **spec}}


def _container(name="app", requests=None, limits=None, **extra):
    resources = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "resources": resources, **extra}


@pytest.mark.parametrize(
    ("requests", "limits", "expected"),
    [
        # BestEffort: minimum shares, no quota, no memory limit, first to be killed.
        (None, None, {"cpu_shares": 2, "cpu_quota": 0, "cpu_period": 100000, "memory_limit_in_bytes": 0,
                      "oom_score_adj": 1000}),
        # Limits only: requests default to them, so the pod is Guaranteed.
        (None, {"cpu": "1", "memory": "128Mi"},
         {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 134217728,
          "oom_score_adj": -997}),
        # The kubelet's own example: request 1, limit 2, 128Mi -> Burstable, 1000 - 1000*128Mi/4Gi = 969.
        ({"cpu": "1"}, {"cpu": "2", "memory": "128Mi"},
         {"cpu_shares": 1024, "cpu_quota": 200000, "cpu_period": 100000, "memory_limit_in_bytes": 134217728,
          "oom_score_adj": 969}),
        ({"cpu": "100m"}, None,
         {"cpu_shares": 102, "cpu_quota": 0, "cpu_period": 100000, "memory_limit_in_bytes": 0,
          "oom_score_adj": 999}),  # 1000 would equal BestEffort
        ({"cpu": "0", "memory": "1Gi"}, {"cpu": "250m"},
         {"cpu_shares": 2, "cpu_quota": 25000, "cpu_period": 100000, "memory_limit_in_bytes": 0,
          "oom_score_adj": 750}),
        ({"memory": "8Gi"}, None,
         {"cpu_shares": 2, "cpu_quota": 0, "cpu_period": 100000, "memory_limit_in_bytes": 0,
          "oom_score_adj": 3}),  # never as low as Guaranteed
        ({"cpu": 2, "memory": "1.5Gi"}, {"memory": "2Gi"},
         {"cpu_shares": 2048, "cpu_quota": 0, "cpu_period": 100000, "memory_limit_in_bytes": 2 * GI,
          "oom_score_adj": 625}),
    ],
)
def test_linux_resources_match_the_kubelet(requests, limits, expected):
    container = _container(requests=requests, limits=limits)
    assert linux_resources(_pod(container), container, memory_capacity=CAPACITY, cgroup_v2=False) == expected


def test_cgroup_v2_kills_the_whole_container_on_oom_unless_told_otherwise():
    container = _container()
    assert linux_resources(_pod(container), container, memory_capacity=CAPACITY, cgroup_v2=True)["unified"] == {
        "memory.oom.group": "1"}
    assert "unified" not in linux_resources(_pod(container), container, memory_capacity=CAPACITY, cgroup_v2=True,
                                            single_process_oom_kill=True)


def test_without_cfs_quota_no_period_or_quota_is_set():
    container = _container(limits={"cpu": "1"})
    result = linux_resources(_pod(container), container, memory_capacity=CAPACITY, cpu_cfs_quota=False,
                             cgroup_v2=False)
    assert "cpu_quota" not in result and "cpu_period" not in result


def test_node_critical_static_pods_get_the_guaranteed_score_even_best_effort():
    container = _container()
    static = _pod(container, annotations={CONFIG_SOURCE_ANNOTATION: "file"}, priorityClassName="system-node-critical")
    assert oom_score_adj(static, container, CAPACITY) == -997
    api_pod = _pod(container, priorityClassName="system-node-critical")
    assert oom_score_adj(api_pod, container, CAPACITY) == 1000
    api_pod["spec"]["priority"] = 2000001000
    assert oom_score_adj(api_pod, container, CAPACITY) == -997


def test_sidecar_never_scores_below_the_regular_containers():
    app = _container(requests={"memory": "1Gi"})
    sidecar = _container("proxy", restartPolicy="Always")
    pod = _pod(app, init=[sidecar])
    assert oom_score_adj(pod, app, CAPACITY) == 750
    assert oom_score_adj(pod, sidecar, CAPACITY) == 750
    ordinary_init = _container("setup")
    assert oom_score_adj(_pod(app, init=[ordinary_init]), ordinary_init, CAPACITY) == 999


def test_bad_quantities_name_the_field():
    container = _container(limits={"cpu": "lots"})
    with pytest.raises(ResourceError, match=r"container 'app': resources.limits.cpu: quantity 'lots'"):
        linux_resources(_pod(container), container, memory_capacity=CAPACITY, cgroup_v2=False)


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([_container(limits={"memory": "64Mi"}), _container("b", limits={"memory": "64Mi"})], [], 128 << 20),
        ([_container(limits={"memory": "64Mi"}), _container("b")], [], None),
        ([_container(limits={"memory": "64Mi"})], [_container("i", limits={"memory": "256Mi"})], 256 << 20),
        ([_container(limits={"memory": "64Mi"})],
         [_container("s", limits={"memory": "32Mi"}, restartPolicy="Always"),
          _container("i", limits={"memory": "80Mi"})], 112 << 20),
        ([_container(limits={"memory": "64Mi"})],
         [_container("s", limits={"memory": "32Mi"}, restartPolicy="Always")], 96 << 20),
        ([], [], None),
    ],
)
def test_pod_memory_limit(containers, init, expected):
    assert pod_memory_limit(_pod(*containers, init=init)) == expected


def test_pod_level_memory_limit_wins():
    pod = _pod(_container(), resources={"limits": {"memory": "1Gi"}})
    assert pod_memory_limit(pod) == GI
