"""QoS classes by the kubelet's rules: requests and limits of every container, init containers included."""

import pytest

from edgelet.api.qos import BEST_EFFORT, BURSTABLE, GUARANTEED, qos_class


def res(requests=None, limits=None):
    resources = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return resources


def pod(*container_resources, init=(), pod_resources=None):
    spec = {
        "containers": [{"name": f"c{i}", "image": "img", "resources": r} for i, r in enumerate(container_resources)],
    }
    if init:
        spec["initContainers"] = [{"name": f"i{i}", "image": "img", "resources": r} for i, r in enumerate(init)]
    if pod_resources is not None:
        spec["resources"] = pod_resources
    return {"metadata": {"name": "p", "uid": "u"}, "spec": spec}


FULL = {"cpu": "500m", "memory": "128Mi"}

CASES = [
    ("no resources", pod({}), BEST_EFFORT),
    ("no resources key at all", {"spec": {"containers": [{"name": "a", "image": "i"}]}}, BEST_EFFORT),
    ("zero requests are unset", pod(res(requests={"cpu": "0", "memory": "0"})), BEST_EFFORT),
    ("only non-QoS resources", pod(res(requests={"ephemeral-storage": "1Gi"}, limits={"nvidia.com/gpu": 1})),
     BEST_EFFORT),
    ("requests only", pod(res(requests={"cpu": "100m"})), BURSTABLE),
    ("limits equal requests", pod(res(requests=FULL, limits=FULL)), GUARANTEED),
    ("limits only: requests default to them", pod(res(limits=FULL)), GUARANTEED),
    ("limits with one request defaulted", pod(res(requests={"cpu": "500m"}, limits=FULL)), GUARANTEED),
    ("request below limit", pod(res(requests={"cpu": "250m", "memory": "128Mi"}, limits=FULL)), BURSTABLE),
    ("explicit zero request is not defaulted", pod(res(requests={"cpu": "0"}, limits=FULL)), BURSTABLE),
    ("cpu limit only", pod(res(limits={"cpu": "1"})), BURSTABLE),
    ("memory limit only", pod(res(limits={"memory": "1Gi"})), BURSTABLE),
    ("same amount, other spelling", pod(res(requests={"cpu": "1", "memory": "1Gi"},
                                            limits={"cpu": "1000m", "memory": "1073741824"})), GUARANTEED),
    ("YAML numbers", pod(res(limits={"cpu": 1, "memory": 1073741824})), GUARANTEED),
    ("two guaranteed containers", pod(res(limits=FULL), res(limits={"cpu": "2", "memory": "1Gi"})), GUARANTEED),
    ("guaranteed plus best effort", pod(res(limits=FULL), {}), BURSTABLE),
    ("guaranteed plus burstable", pod(res(limits=FULL), res(requests={"cpu": "1m"})), BURSTABLE),
    ("init container guaranteed too", pod(res(limits=FULL), init=[res(limits=FULL)]), GUARANTEED),
    ("init container without limits", pod(res(limits=FULL), init=[{}]), BURSTABLE),
    ("init container alone sets requests", pod({}, init=[res(requests={"memory": "64Mi"})]), BURSTABLE),
    ("pod-level limits decide", pod({}, pod_resources=res(limits=FULL)), GUARANTEED),
    ("pod-level requests only", pod(res(limits=FULL), pod_resources=res(requests={"cpu": "1"})), BURSTABLE),
    ("pod-level cpu limit only", pod({}, pod_resources=res(limits={"cpu": "1"})), BURSTABLE),
]


@pytest.mark.parametrize(("name", "the_pod", "expected"), CASES, ids=[c[0] for c in CASES])
def test_qos_class(name, the_pod, expected):
    assert qos_class(the_pod) == expected


@pytest.mark.parametrize(
    ("the_pod", "field"),
    [
        (pod(res(limits={"cpu": "lots"})), "spec.containers[0].resources.limits.cpu"),
        (pod({}, res(requests={"memory": "1KB"})), "spec.containers[1].resources.requests.memory"),
        (pod({}, init=[res(limits={"memory": True})]), "spec.initContainers[0].resources.limits.memory"),
        (pod({}, pod_resources=res(requests={"cpu": "1x"})), "spec.resources.requests.cpu"),
    ],
)
def test_bad_quantity_names_the_field(the_pod, field):
    with pytest.raises(ValueError) as excinfo:
        qos_class(the_pod)
    assert str(excinfo.value).startswith(field + ": ")
