"""The CRI security context's namespaces: the pod's choices, and an ephemeral container's target PID namespace."""

import pytest

from edgelet.kuberuntime.container import (
    NAMESPACE_CONTAINER,
    NAMESPACE_NODE,
    NAMESPACE_POD,
    NAMESPACE_TARGET,
    security_context,
)


def pod(**spec):
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}


@pytest.mark.parametrize(
    ("spec", "target", "expected"),
    [
        ({}, "", (NAMESPACE_CONTAINER, "")),
        ({}, "c0ffee", (NAMESPACE_TARGET, "c0ffee")),  # kubectl debug --target main
        ({"shareProcessNamespace": True}, "", (NAMESPACE_POD, "")),
        ({"shareProcessNamespace": True}, "c0ffee", (NAMESPACE_POD, "")),  # it sees every process already
        ({"hostPID": True}, "c0ffee", (NAMESPACE_NODE, "")),
    ],
)
def test_pid_namespace(spec, target, expected):
    options = security_context(pod(**spec), {"name": "debugger"}, target).namespace_options
    assert (options.pid, options.target_id) == expected


def test_network_and_ipc_follow_the_pod():
    options = security_context(pod(hostNetwork=True, hostIPC=True), {"name": "main"}).namespace_options
    assert (options.network, options.ipc) == (NAMESPACE_NODE, NAMESPACE_NODE)
    options = security_context(pod(), {"name": "main"}).namespace_options
    assert (options.network, options.ipc) == (NAMESPACE_POD, NAMESPACE_POD)
