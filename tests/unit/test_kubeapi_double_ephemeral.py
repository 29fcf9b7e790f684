"""The API double's pods/ephemeralcontainers rules: the object each API version serves, additions only, defaults."""

import pytest

from tests.kubeapi_double.ephemeral import ALPHA_OBJECT, POD_OBJECT, updated_pod, view
from tests.kubeapi_double.store import StatusError

DEBUG = {"name": "debug", "image": "busybox:1.36", "stdin": True}


def stored_pod(ephemeral=()):
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "web", "namespace": "default", "uid": "u",
                                                           "resourceVersion": "7"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], "ephemeralContainers": list(ephemeral)}}


def test_views():
    pod = stored_pod([DEBUG])
    assert view(pod, POD_OBJECT) == pod
    assert view(pod, ALPHA_OBJECT) == {"kind": "EphemeralContainers", "apiVersion": "v1",
                                       "metadata": pod["metadata"], "ephemeralContainers": [DEBUG]}


@pytest.mark.parametrize("api", [POD_OBJECT, ALPHA_OBJECT])
def test_an_addition_is_defaulted_and_stored(api):
    written = view(stored_pod(), api)
    (written["spec"] if api == POD_OBJECT else written).setdefault("ephemeralContainers", []).append(DEBUG)
    new = updated_pod(stored_pod(), written, api)
    assert new["spec"]["ephemeralContainers"] == [{**DEBUG, "imagePullPolicy": "IfNotPresent",
                                                   "terminationMessagePath": "/dev/termination-log",
                                                   "terminationMessagePolicy": "File", "resources": {}}]


@pytest.mark.parametrize(
    ("containers", "fragment"),
    [
        ([], 'existing ephemeral containers "debug" may not be removed'),
        ([{**DEBUG, "image": "busybox:2"}], 'existing ephemeral containers "debug" may not be changed'),
        ([{"name": "main", "image": "x"}], 'Duplicate value: "main"'),
        ([{"name": "x", "image": "x", "ports": [{"containerPort": 80}]}], "ports: Forbidden"),
    ],
)
def test_refused_writes(containers, fragment):
    old = updated_pod(stored_pod(), {"kind": "EphemeralContainers", "ephemeralContainers": [DEBUG]}, ALPHA_OBJECT)
    keep = old["spec"]["ephemeralContainers"] if "removed" not in fragment and "changed" not in fragment else []
    with pytest.raises(StatusError) as caught:
        updated_pod(old, {"kind": "EphemeralContainers", "ephemeralContainers": keep + containers}, ALPHA_OBJECT)
    assert caught.value.code == 422 and fragment in caught.value.message


def test_the_wrong_object_is_a_bad_request():
    with pytest.raises(StatusError) as caught:
        updated_pod(stored_pod(), stored_pod(), ALPHA_OBJECT)
    assert caught.value.code == 400
