"""The newer pod status fields: each container's process identity and observedGeneration."""

from __future__ import annotations

from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus
from edgelet.status.extras import add_newer_fields


def _runtime(user):
    return PodRuntimeStatus(uid="u", containers=[ContainerStatus(
        id="abc", name="main", sandbox_id="s", state=ContainerState.RUNNING, created_at=1, user=user)])


def _status():
    return {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"},
                           {"type": "example.com/gate", "status": "True"}],
            "containerStatuses": [{"name": "main", "containerID": "containerd://abc"},
                                  {"name": "other", "containerID": ""}]}


def test_the_user_of_each_container_comes_from_the_runtime():
    status = add_newer_fields(_status(), {"metadata": {}}, _runtime((1000, 3000, (3000, 4000))))
    assert status["containerStatuses"][0]["user"] == {"linux": {"uid": 1000, "gid": 3000,
                                                                "supplementalGroups": [3000, 4000]}}
    assert "user" not in status["containerStatuses"][1]
    status = add_newer_fields(_status(), {"metadata": {}}, _runtime((0, 0, ())))
    assert status["containerStatuses"][0]["user"] == {"linux": {"uid": 0, "gid": 0}}
    # A runtime that does not report it (containerd 1.x): no field, as the kubelet leaves it.
    assert "user" not in add_newer_fields(_status(), {"metadata": {}}, _runtime(None))["containerStatuses"][0]


def test_observed_generation_on_the_status_and_the_kubelets_conditions():
    status = add_newer_fields(_status(), {"metadata": {"generation": 3}}, _runtime(None))
    assert status["observedGeneration"] == 3
    generations = {c["type"]: c.get("observedGeneration") for c in status["conditions"]}
    assert generations == {"Ready": 3, "PodScheduled": None, "example.com/gate": None}
    # No generation (API servers before 1.33, static pods): nothing to observe.
    for pod in ({"metadata": {}}, {"metadata": {"generation": True}}):
        status = add_newer_fields(_status(), pod, _runtime(None))
        assert "observedGeneration" not in status
        assert all("observedGeneration" not in c for c in status["conditions"])
