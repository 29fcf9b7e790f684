"""The node's pod network as the kubelet reads it from CRI Status (NetworkReady), and what it holds back: the node's
Ready condition, and pods on the pod network (host-network pods run)."""

from __future__ import annotations

import pytest

from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kubelet.runtimestate import network_readiness

NOT_READY = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
             "message:Network plugin returns error: cni plugin not initialized")


def status(*conditions: tuple[str, bool, str, str]) -> pb.StatusResponse:
    return pb.StatusResponse(status=pb.RuntimeStatus(conditions=[
        pb.RuntimeCondition(type=kind, status=ok, reason=reason, message=message)
        for kind, ok, reason, message in conditions]))


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (status(("RuntimeReady", True, "", ""), ("NetworkReady", True, "", "")), (True, "")),
        (status(("RuntimeReady", True, "", ""), ("NetworkReady", False, "NetworkPluginNotReady",
                                                 "Network plugin returns error: cni plugin not initialized")),
         (False, NOT_READY)),
        (status(("RuntimeReady", True, "", "")), (False, "container runtime network not ready: <nil>")),
    ],
)
def test_network_readiness_in_the_kubelets_words(reply, expected):
    assert network_readiness(reply) == expected


HOST_POD = {"metadata": {"name": "flannel", "uid": "u1"}, "spec": {"hostNetwork": True, "containers": []}}
NET_POD = {"metadata": {"name": "web", "uid": "u2"}, "spec": {"containers": []}}


@pytest.mark.parametrize(
    ("pod", "network", "waits"),
    [(NET_POD, (True, ""), None), (HOST_POD, (False, NOT_READY), None),
     (NET_POD, (False, NOT_READY), f"network is not ready: {NOT_READY}")],
)
def test_only_pods_on_the_pod_network_wait_for_it(pod, network, waits):
    from edgelet.kubelet.podsync import network_wait

    assert network_wait(pod, network) == waits


@pytest.mark.parametrize(
    ("text", "taint"),
    [("dedicated=edge:NoSchedule", {"key": "dedicated", "value": "edge", "effect": "NoSchedule"}),
     ("example.com/gpu:NoExecute", {"key": "example.com/gpu", "effect": "NoExecute"}),
     ("k=:PreferNoSchedule", {"key": "k", "effect": "PreferNoSchedule"})],
)
def test_register_with_taints_as_the_kubelet_reads_them(text, taint):
    from edgelet.nodestatus.taints import parse_taint

    assert parse_taint(text) == taint


@pytest.mark.parametrize(
    ("text", "problem"),
    [("dedicated", "is not"), ("k=v:Sometimes", "effect 'Sometimes'"), ("bad key!=v:NoSchedule", "key"),
     ("k=bad value:NoSchedule", "value")],
)
def test_bad_taints_name_the_config_key(text, problem):
    from edgelet.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config({"node_name": "n", "cluster": {"kubeconfig": "k", "register_with_taints": [text]}})
    assert caught.value.key == "cluster.register_with_taints" and problem in caught.value.message


@pytest.mark.parametrize(
    ("spec", "cidrs"),
    [({}, ""), ({"podCIDR": "10.244.1.0/24"}, "10.244.1.0/24"),
     ({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"]}, "10.244.1.0/24,fd00:1::/64")],
)
def test_pod_cidrs_as_the_kubelet_hands_them_over(spec, cidrs):
    from edgelet.nodestatus.setters import pod_cidrs

    assert pod_cidrs({"spec": spec}) == cidrs
