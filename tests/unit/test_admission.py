"""Pod admission decisions, table-tested."""

from __future__ import annotations

import copy

import pytest

from edgelet.lifecycle.admission import ADMIT, Verdict, admit, rejected_status, unsupported_features
from edgelet.podconfig.defaults import apply_defaults

RAW = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
    "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
}

BASE = apply_defaults(copy.deepcopy(RAW))  # API pods arrive defaulted by the API server


def pod_with(**spec_changes):
    pod = copy.deepcopy(RAW)
    pod["spec"].update(spec_changes)
    return apply_defaults(pod)


@pytest.mark.parametrize(
    "pod, active, expected_reason, message_part",
    [
        (BASE, 0, "", ""),
        (BASE, 109, "", ""),
        (BASE, 110, "OutOfpods", "pods, limit: 110"),
        (pod_with(containers=[]), 0, "InvalidPodSpec", "spec.containers"),
        (pod_with(containers=[{"name": "c"}]), 0, "InvalidPodSpec", "spec.containers[0].image"),
        (pod_with(initContainers=[{"name": "s", "image": "x:1", "restartPolicy": "Always"}]), 0, "", ""),
        (pod_with(ephemeralContainers=[{"name": "debug", "image": "x:1", "targetContainerName": "c"}]), 0, "", ""),
        (pod_with(ephemeralContainers=[{"name": "debug", "image": "x:1", "ports": [{"containerPort": 80}]}]), 0,
         "InvalidPodSpec", "spec.ephemeralContainers[0].ports: may not be set on ephemeral containers"),
        (pod_with(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]), 0, "", ""),
        (pod_with(volumes=[{"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]), 0, "", ""),
        (pod_with(volumes=[{"name": "data", "nfs": {"server": "s", "path": "/"}}]), 0,
         "UnsupportedFeature", "spec.volumes[0] (data): nfs"),
        (pod_with(volumes=[{"name": "cache", "emptyDir": {}}]), 0, "", ""),
        # Another OS: refused first, before capacity (the kubelet's predicate order).
        (pod_with(os={"name": "windows"}), 110, "PodOSNotSupported", "the OS field doesn't match node OS"),
        (pod_with(os={"name": "linux"}), 0, "", ""),
        ({**BASE, "metadata": {**BASE["metadata"], "labels": {"kubernetes.io/os": "windows"}}}, 0,
         "PodOSSelectorNodeLabelDoesNotMatch", "`kubernetes.io/os` label doesn't match node label"),
        ({**BASE, "metadata": {**BASE["metadata"], "labels": {"kubernetes.io/os": "linux"}}}, 0, "", ""),
    ],
)
def test_admit(pod, active, expected_reason, message_part):
    verdict = admit(pod, active_pods=active, max_pods=110)
    assert verdict.admit is (expected_reason == "")
    assert verdict.reason == expected_reason
    assert message_part in verdict.message


@pytest.mark.parametrize("source, admitted", [("file", True), ("http", True), ("api", False)])
def test_manifest_pods_are_not_validated_twice(source, admitted):
    """File and HTTP pods were validated when their manifest was parsed (an invalid one never gets here),
    so admission does not repeat it; API pods it validates."""
    pod = pod_with(containers=[{"name": "c"}])  # no image: what parse_manifest refuses
    pod["metadata"]["annotations"] = {"kubernetes.io/config.source": source}
    assert admit(pod, active_pods=0, max_pods=110).admit is admitted


def test_extra_checks_run_last_and_first_rejection_wins():
    calls = []

    def no(pod):
        calls.append("no")
        return Verdict(False, "Evicted", "The node had condition: [MemoryPressure].")

    def never_reached(pod):
        calls.append("never")
        return ADMIT

    assert admit(BASE, active_pods=1, max_pods=1, extra=[no]).reason == "OutOfpods"
    assert calls == []
    verdict = admit(BASE, active_pods=0, max_pods=10, extra=[lambda p: ADMIT, no, never_reached])
    assert verdict.reason == "Evicted" and calls == ["no"]


def test_unsupported_features_lists_every_problem():
    pod = pod_with(volumes=[{"name": "a", "nfs": {"server": "s", "path": "/"}}, {"name": "b", "iscsi": {}}])
    assert unsupported_features(pod) == ["spec.volumes[0] (a): nfs volumes", "spec.volumes[1] (b): iscsi volumes"]


def test_a_static_pods_claims_are_refused():
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]
    static = pod_with(volumes=volumes)
    static["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    assert unsupported_features(static) == ["spec.volumes[0] (data): persistentVolumeClaim volumes of a static pod"]
    assert unsupported_features(pod_with(volumes=volumes)) == []


def test_rejected_status_is_failed_with_reason():
    assert rejected_status(Verdict(False, "OutOfpods", "m")) == {
        "phase": "Failed", "reason": "OutOfpods", "message": "m"}


def test_node_features_edgelet_leaves_out_are_refused_by_name():
    from edgelet.lifecycle.admission import unsupported_features

    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {
        "hostUsers": False, "resources": {"limits": {"cpu": "1"}}, "resourceClaims": [{"name": "gpu"}],
        "volumes": [{"name": "tools", "image": {"reference": "tools:1"}}],
        "containers": [{"name": "c", "volumeMounts": [{"name": "tools", "mountPath": "/t", "readOnly": True,
                                                         "recursiveReadOnly": "Enabled"},
                                                        {"name": "tools", "mountPath": "/u",
                                                         "recursiveReadOnly": "IfPossible"}]}]}}
    assert unsupported_features(pod) == [
        "spec.volumes[0] (tools): image volumes", "spec.hostUsers: false (user namespaces)",
        "spec.resources (pod-level resources)", "spec.resourceClaims (dynamic resource allocation)",
        "spec.containers[0].volumeMounts[0]: recursiveReadOnly: Enabled"]


def test_a_strict_supplemental_groups_policy_needs_a_runtime_that_keeps_it():
    from edgelet.lifecycle.admission import supplemental_groups_check

    strict = {"spec": {"securityContext": {"supplementalGroupsPolicy": "Strict"}, "containers": []}}
    merge = {"spec": {"securityContext": {"supplementalGroupsPolicy": "Merge"}, "containers": []}}
    verdict = supplemental_groups_check(strict, False)
    assert (verdict.admit, verdict.reason, verdict.message) == (
        False, "SupplementalGroupsPolicyNotSupported", "SupplementalGroupsPolicy=Strict is not supported in this node")
    assert supplemental_groups_check(strict, True).admit
    assert supplemental_groups_check(merge, False).admit
