"""Pod admission: whether this node can run a pod at all, decided before any container starts (pure).

The kubelet rejects such pods with phase Failed and a reason; so do we, and the pod never runs.
Other managers (eviction, CPU) add their own checks through `extra`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.kuberuntime import security
from edgelet.podconfig.validation import validate_pod
from edgelet.util.errors import cut_long_values

# Volume sources the volume manager can set up; any other is an unsupported feature on this node.
SUPPORTED_VOLUME_SOURCES = frozenset(
    {"hostPath", "emptyDir", "secret", "configMap", "projected", "downwardAPI",
     # Claims bound to hostPath or local PersistentVolumes (volumes/claims.py); generic ephemeral volumes are claims.
     "persistentVolumeClaim", "ephemeral",
     # CSI ephemeral inline volumes (edgelet.csi).
     "csi"}
)


CLAIM_SOURCES = frozenset({"persistentVolumeClaim", "ephemeral"})


@dataclass(frozen=True, slots=True)
class Verdict:
    admit: bool
    reason: str = ""
    message: str = ""


ADMIT = Verdict(True)
# Pods from manifests were validated once, when their manifest was parsed (podconfig/manifest.py), where a
# problem is reported naming the file and field and the pod never gets here; API pods are validated here.
VALIDATED_AT_SOURCE = frozenset({podutil.SOURCE_FILE, podutil.SOURCE_HTTP})
Check = Callable[[Pod], Verdict]


def unsupported_features(pod: Pod) -> list[str]:
    """What the pod asks for that edgelet does not do (a clear no beats a pod that half works)."""
    problems = []
    spec = podutil.spec(pod)
    static = podutil.is_static(pod)
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = [key for key in volume if key != "name"]
        unsupported = [k for k in kinds if k not in SUPPORTED_VOLUME_SOURCES]
        if unsupported:
            problems.append(f"spec.volumes[{i}] ({volume.get('name', '?')}): {unsupported[0]} volumes")
        elif static and (claims := [k for k in kinds if k in CLAIM_SOURCES]):
            # A static pod's claims cannot be read: the API graph the node authorizer follows has no such pod.
            problems.append(f"spec.volumes[{i}] ({volume.get('name', '?')}): {claims[0]} volumes of a static pod")
    return problems + _features_left_out(pod)


def _features_left_out(pod: Pod) -> list[str]:
    """Node features of 1.29-1.36 edgelet does not implement (README, "Kubernetes node features")."""
    spec = podutil.spec(pod)
    problems = []
    if spec.get("hostUsers") is False:
        problems.append("spec.hostUsers: false (user namespaces)")
    if spec.get("resources"):
        problems.append("spec.resources (pod-level resources)")
    if spec.get("resourceClaims"):
        problems.append("spec.resourceClaims (dynamic resource allocation)")
    for kind, containers in (("initContainers", podutil.init_containers(pod)), ("containers", podutil.containers(pod))):
        for i, container in enumerate(containers):
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("recursiveReadOnly") == "Enabled":
                    problems.append(f"spec.{kind}[{i}].volumeMounts[{j}]: recursiveReadOnly: Enabled")
    return problems


def supplemental_groups_check(pod: Pod, runtime_supports_strict: bool) -> Verdict:
    """The kubelet's refusal of supplementalGroupsPolicy Strict where the runtime cannot keep it (1.33+)."""
    policy = (podutil.spec(pod).get("securityContext") or {}).get("supplementalGroupsPolicy")
    if policy == "Strict" and not runtime_supports_strict:
        return Verdict(False, "SupplementalGroupsPolicyNotSupported",
                       "SupplementalGroupsPolicy=Strict is not supported in this node")
    return ADMIT


def sysctl_check(allowed_unsafe: Iterable[str], kernel_release: str) -> Check:
    """The kubelet's sysctl admission: the safe sysctls this kernel namespaces plus the node's allowed unsafe ones,
    none of a namespace the pod shares with the host."""
    allowlist = security.sysctl_allowlist(tuple(allowed_unsafe), security.kernel_version(kernel_release))

    def check(pod: Pod) -> Verdict:
        problem = security.sysctl_refusal(pod, allowlist)
        return Verdict(False, security.SYSCTL_REASON, problem) if problem else ADMIT
    return check


def apparmor_check(host_enabled: bool) -> Check:
    """The kubelet's AppArmor admission: profiles other than Unconfined need AppArmor on the host."""
    def check(pod: Pod) -> Verdict:
        problem = security.apparmor_refusal(pod, host_enabled)
        return Verdict(False, security.APPARMOR_REASON, problem) if problem else ADMIT
    return check


NODE_OS = "linux"
OS_LABEL = "kubernetes.io/os"


def os_check(pod: Pod) -> Verdict:
    """The kubelet's first refusals (lifecycle/predicate.go): a pod labelled for another OS, or whose spec.os
    names another OS, never runs here."""
    label = podutil.meta(pod).get("labels") or {}
    if OS_LABEL in label and label[OS_LABEL] != NODE_OS:
        return Verdict(False, "PodOSSelectorNodeLabelDoesNotMatch",
                       "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label")
    pod_os = podutil.spec(pod).get("os")
    if isinstance(pod_os, dict) and pod_os.get("name") != NODE_OS:
        return Verdict(False, "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    return ADMIT


def admit(pod: Pod, *, active_pods: int, max_pods: int, extra: Iterable[Check] = ()) -> Verdict:
    """The first reason not to run the pod, in the kubelet's order: the OS, capacity, then the pod itself."""
    verdict = os_check(pod)
    if not verdict.admit:
        return verdict
    if active_pods >= max_pods:
        return Verdict(False, "OutOfpods", f"Node didn't have enough resource: pods, limit: {max_pods}")
    problems = validate_pod(pod) if podutil.source(pod) not in VALIDATED_AT_SOURCE else []
    if problems:
        detail = cut_long_values("; ".join(f"{path}: {message}" if path else message for path, message in problems[:5]))
        return Verdict(False, "InvalidPodSpec", f"Pod spec rejected by the node: {detail}")
    unsupported = unsupported_features(pod)
    if unsupported:
        return Verdict(False, "UnsupportedFeature", "Not supported by edgelet: " + "; ".join(unsupported))
    for check in extra:
        verdict = check(pod)
        if not verdict.admit:
            return verdict
    return ADMIT


def rejected_status(verdict: Verdict) -> dict:
    """The status the kubelet gives a pod it rejects at admission."""
    return {"phase": "Failed", "reason": verdict.reason, "message": verdict.message}
