"""The API double's pods/ephemeralcontainers rules: a Pod read and written, additions only, defaults."""

import pytest

from tests.kubeapi_double.ephemeral import updated_pod, view
from tests.kubeapi_double.store import StatusError

DEBUG = {"name": "debug", "image": "busybox:1.36", "stdin": True}


def stored_pod(ephemeral=()):
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "web", "namespace": "default", "uid": "u",
                                                           "resourceVersion": "7"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], "ephemeralContainers": list(ephemeral)}}


def with_ephemeral(pod, containers):
    return {**pod, "spec": {**pod["spec"], "ephemeralContainers": containers}}


def test_the_view_is_the_pod():
    pod = stored_pod([DEBUG])
    assert view(pod) == pod


def test_an_addition_is_defaulted_and_stored():
    written = view(stored_pod())
    written["spec"]["ephemeralContainers"].append(DEBUG)
    new = updated_pod(stored_pod(), written)
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
    old = updated_pod(stored_pod(), with_ephemeral(stored_pod(), [DEBUG]))
    keep = old["spec"]["ephemeralContainers"] if "removed" not in fragment and "changed" not in fragment else []
    with pytest.raises(StatusError) as caught:
        updated_pod(old, with_ephemeral(old, keep + containers))
    assert caught.value.code == 422 and fragment in caught.value.message
    assert caught.value.message.startswith('Pod "web" is invalid: ')


def test_the_wrong_object_is_a_bad_request():
    with pytest.raises(StatusError) as caught:
        updated_pod(stored_pod(), {"kind": "EphemeralContainers", "ephemeralContainers": [DEBUG]})
    assert caught.value.code == 400
