"""The pod security decisions (edgelet.kuberuntime.security) against the kubelet 1.36's: seccomp and AppArmor
profiles, the privileged sandbox, masked /proc paths, runAsNonRoot, sysctl and AppArmor admission."""

import pytest

from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kuberuntime import security
from edgelet.kuberuntime.container import security_context
from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.kuberuntime.security import SecurityContextError, SecuritySettings
from edgelet.lifecycle.admission import apparmor_check, sysctl_check

RUNTIME_DEFAULT, UNCONFINED, LOCALHOST = (pb.SecurityProfile.RuntimeDefault, pb.SecurityProfile.Unconfined,
                                          pb.SecurityProfile.Localhost)
ROOT = "/var/lib/edgelet/seccomp"


def pod(pod_sc=None, container_sc=None, annotations=None, **spec):
    container = {"name": "main", "image": "busybox"}
    if container_sc is not None:
        container["securityContext"] = container_sc
    spec = {"containers": [container], **spec}
    if pod_sc is not None:
        spec["securityContext"] = pod_sc
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations or {}},
            "spec": spec}


def main(p):
    return p["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "default", "expected"),
    [
        (None, None, False, (UNCONFINED, "")),  # the kubelet's default: no filter
        (None, None, True, (RUNTIME_DEFAULT, "")),  # --seccomp-default
        ({"seccompProfile": {"type": "RuntimeDefault"}}, None, False, (RUNTIME_DEFAULT, "")),
        ({"seccompProfile": {"type": "RuntimeDefault"}}, {"seccompProfile": {"type": "Unconfined"}}, False,
         (UNCONFINED, "")),  # the container's field wins
        (None, {"seccompProfile": {"type": "Unconfined"}}, True, (UNCONFINED, "")),  # asked for beats the default
        (None, {"seccompProfile": {"type": "Localhost", "localhostProfile": "a/deny.json"}}, False,
         (LOCALHOST, f"{ROOT}/a/deny.json")),
        (None, {"privileged": True, "seccompProfile": {"type": "RuntimeDefault"}}, False, (RUNTIME_DEFAULT, "")),
    ],
)
def test_seccomp_profile(pod_sc, container_sc, default, expected):
    p = pod(pod_sc, container_sc)
    profile = security.seccomp_profile(p, main(p), SecuritySettings(default, ROOT))
    assert (profile.profile_type, profile.localhost_ref) == expected


def test_seccomp_annotations_are_not_read_any_more():
    p = pod(annotations={"seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
                         "container.seccomp.security.alpha.kubernetes.io/main": "runtime/default"})
    assert security.seccomp_profile(p, main(p), SecuritySettings(False, ROOT)).profile_type == UNCONFINED


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"type": "Localhost"}, "localhostProfile must be set if seccompProfile type is Localhost."),
        ({"type": "Localhost", "localhostProfile": "../../etc/shadow"}, "must be a descending relative path"),
        ({"type": "Localhost", "localhostProfile": "/etc/x.json"}, "must be a descending relative path"),
        ({"type": "Permissive"}, "unknown seccompProfile type 'Permissive'"),
    ],
)
def test_seccomp_profile_refusals(profile, message):
    p = pod(container_sc={"seccompProfile": profile})
    with pytest.raises(SecurityContextError, match=message.replace(".", r"\.")):
        security.seccomp_profile(p, main(p), SecuritySettings(False, ROOT))


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "annotations", "expected"),
    [
        (None, None, {}, (None, "")),  # nothing asked: the runtime's own default
        ({"appArmorProfile": {"type": "RuntimeDefault"}}, None, {}, ((RUNTIME_DEFAULT, ""), "runtime/default")),
        (None, None, {"container.apparmor.security.beta.kubernetes.io/main": "localhost/k8s-x"},
         ((LOCALHOST, "k8s-x"), "localhost/k8s-x")),
        ({"appArmorProfile": {"type": "RuntimeDefault"}}, None,
         {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"},
         ((UNCONFINED, ""), "unconfined")),  # the container's annotation before the pod's field
        (None, {"appArmorProfile": {"type": "Unconfined"}},
         {"container.apparmor.security.beta.kubernetes.io/main": "runtime/default"},
         ((UNCONFINED, ""), "unconfined")),  # the container's field first
        (None, None, {"container.apparmor.security.beta.kubernetes.io/other": "runtime/default"}, (None, "")),
    ],
)
def test_apparmor_profile(pod_sc, container_sc, annotations, expected):
    p = pod(pod_sc, container_sc, annotations)
    context = security_context(p, main(p))
    sent = (context.apparmor.profile_type, context.apparmor.localhost_ref) if context.HasField("apparmor") else None
    assert (sent, context.apparmor_profile) == expected


NO_APPARMOR = "Cannot enforce AppArmor: AppArmor is not enabled on the host"


@pytest.mark.parametrize(
    ("p", "host_enabled", "expected"),
    [
        (pod(), False, ""),
        (pod({"appArmorProfile": {"type": "Unconfined"}}), False, ""),
        (pod({"appArmorProfile": {"type": "RuntimeDefault"}}), False, NO_APPARMOR),
        (pod(container_sc={"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-x"}}), False,
         NO_APPARMOR),
        (pod(annotations={"container.apparmor.security.beta.kubernetes.io/main": "runtime/default"}), False,
         NO_APPARMOR),
        (pod(annotations={"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}), False, ""),
        (pod({"appArmorProfile": {"type": "RuntimeDefault"}}), True, ""),
        (pod(container_sc={"appArmorProfile": {"type": "Localhost", "localhostProfile": " "}}), True,
         "Cannot enforce AppArmor: invalid empty AppArmor profile name: "
         "{'type': 'Localhost', 'localhostProfile': ' '}"),
    ],
)
def test_apparmor_admission(p, host_enabled, expected):
    verdict = apparmor_check(host_enabled)(p)
    assert (verdict.admit, verdict.reason if not verdict.admit else "", verdict.message) == (
        not expected, "AppArmor" if expected else "", expected)


@pytest.mark.parametrize(
    ("spec", "privileged"),
    [
        ({}, False),
        ({"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]}, True),
        ({"ephemeralContainers": [{"name": "debug", "securityContext": {"privileged": True}}]}, True),
        ({"initContainers": [{"name": "i", "securityContext": {"privileged": False}}]}, False),
    ],
)
def test_sandbox_is_privileged_when_any_container_is(spec, privileged):
    config = make_sandbox_config(pod(**spec), 0, logs_root="/logs")
    context = config.linux.security_context
    assert context.privileged is privileged
    assert context.seccomp.profile_type == RUNTIME_DEFAULT  # whatever the pod asks, as the kubelet's sandbox


def test_sandbox_takes_the_pods_users_groups_and_selinux():
    selinux = {"user": "u", "role": "r", "type": "t", "level": "s0:c1,c2"}
    p = pod({"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000, "supplementalGroups": [4000],
             "seLinuxOptions": selinux})
    context = make_sandbox_config(p, 0, logs_root="/logs").linux.security_context
    assert (context.run_as_user.value, context.run_as_group.value) == (1000, 2000)
    assert list(context.supplemental_groups) == [3000, 4000]
    assert (context.selinux_options.user, context.selinux_options.level) == ("u", "s0:c1,c2")


@pytest.mark.parametrize(
    ("container_sc", "masked", "readonly"),
    [
        (None, security.DEFAULT_MASKED_PATHS, security.DEFAULT_READONLY_PATHS),
        # The kubelet sends them to privileged containers too: the runtime drops them there.
        ({"privileged": True}, security.DEFAULT_MASKED_PATHS, security.DEFAULT_READONLY_PATHS),
        ({"procMount": "Default"}, security.DEFAULT_MASKED_PATHS, security.DEFAULT_READONLY_PATHS),
        ({"procMount": "Unmasked"}, (), ()),
    ],
)
def test_proc_paths(container_sc, masked, readonly):
    p = pod(container_sc=container_sc)
    context = security_context(p, main(p))
    assert (tuple(context.masked_paths), tuple(context.readonly_paths)) == (masked, readonly)
    assert "/proc/kcore" in security.DEFAULT_MASKED_PATHS and "/proc/sys" in security.DEFAULT_READONLY_PATHS


def test_container_context_inherits_the_pods_selinux_and_users():
    p = pod({"seLinuxOptions": {"type": "spc_t"}, "runAsUser": 7, "runAsGroup": 8},
            {"runAsUser": 9, "seccompProfile": {"type": "RuntimeDefault"}})
    context = security_context(p, main(p))
    assert (context.selinux_options.type, context.run_as_user.value, context.run_as_group.value) == ("spc_t", 9, 8)
    assert context.seccomp.profile_type == RUNTIME_DEFAULT


@pytest.mark.parametrize(
    ("image_user", "expected"),
    [((1000, ""), (True, 1000, "")), ((None, "app"), (False, 0, "app")), ((None, ""), (False, 0, ""))],
)
def test_image_user_when_the_pod_names_none(image_user, expected):
    p = pod()
    context = security_context(p, main(p), image_user=image_user)
    assert (context.HasField("run_as_user"), context.run_as_user.value, context.run_as_username) == expected


WHO = '(pod: "p_ns(u1)", container: main)'


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "image_uid", "image_user", "expected"),
    [
        (None, None, 0, "", ""),  # runAsNonRoot not asked
        ({"runAsNonRoot": True}, None, 0, "", f"container has runAsNonRoot and image will run as root {WHO}"),
        ({"runAsNonRoot": True}, None, 1000, "", ""),
        ({"runAsNonRoot": True}, None, None, "app",
         f"container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root {WHO}"),
        ({"runAsNonRoot": True}, {"runAsUser": 0}, 1000, "", f"container's runAsUser breaks non-root policy {WHO}"),
        ({"runAsNonRoot": True, "runAsUser": 5}, None, 0, "", ""),  # the pod's user, not the image's
        ({"runAsNonRoot": True}, {"runAsNonRoot": False}, 0, "", ""),  # the container's choice wins
    ],
)
def test_run_as_non_root(pod_sc, container_sc, image_uid, image_user, expected):
    p = pod(pod_sc, container_sc)
    assert security.run_as_non_root_error(p, main(p), image_uid, image_user) == expected


@pytest.mark.parametrize(
    ("sysctls", "spec", "allowed", "expected"),
    [
        ([("kernel.shm_rmid_forced", "1"), ("net.ipv4.tcp_rmem", "4096 87380 6291456")], {}, (), ""),
        ([("net/ipv4/ip_local_port_range", "1024 65000")], {}, (), ""),  # slashes, as the kubelet normalizes
        ([("kernel.msgmax", "9000")], {}, (), 'forbidden sysctl: "kernel.msgmax" not allowlisted'),
        ([("kernel.msgmax", "9000")], {}, ("kernel.msg*",), ""),
        ([("net.core.somaxconn", "1024")], {}, ("net.core.*",), ""),
        ([("net.core.somaxconn", "1024")], {"hostNetwork": True}, ("net.core.*",),
         'forbidden sysctl: "net.core.somaxconn" not allowed with host Net enabled'),
        ([("net.ipv4.ping_group_range", "0 1")], {"hostNetwork": True}, (),
         'forbidden sysctl: "net.ipv4.ping_group_range" not allowed with host Net enabled'),
        ([("kernel.shm_rmid_forced", "1")], {"hostIPC": True}, (),
         'forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host IPC enabled'),
        ([("kernel.shm_rmid_forced", "1")], {"hostNetwork": True}, (), ""),  # its own IPC namespace
        ([("vm.swappiness", "1")], {}, (), 'forbidden sysctl: "vm.swappiness" not allowlisted'),
    ],
)
def test_sysctl_admission(sysctls, spec, allowed, expected):
    p = pod({"sysctls": [{"name": n, "value": v} for n, v in sysctls]}, **spec)
    verdict = sysctl_check(allowed, "6.1.0-18-arm64")(p)
    assert (verdict.admit, verdict.reason, verdict.message) == (
        (False, "SysctlForbidden", expected) if expected else (True, "", ""))


def test_newer_safe_sysctls_need_the_kernel_that_namespaced_them():
    p = pod({"sysctls": [{"name": "net.ipv4.tcp_wmem", "value": "4096 16384 4194304"}]})
    assert sysctl_check((), "4.15.0")(p).admit
    assert sysctl_check((), "4.14.300-rt")(p).message == 'forbidden sysctl: "net.ipv4.tcp_wmem" not allowlisted'


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("net.core.*", None), ("kernel.msgmax", None), ("fs.mqueue.*", None), ("net/ipv4/tcp_rmem", None),
        ("kernel.msg*", None),
        ("vm.swappiness", 'the sysctls "vm.swappiness" are not known to be namespaced'),
        ("kernel.*", 'the sysctls "kernel." are not known to be namespaced'),
        ("Net.Core", "must have at most 253 characters"),
    ],
)
def test_allowed_unsafe_sysctl_patterns(pattern, problem):
    error = security.sysctl_pattern_error(pattern)
    assert (error is None) if problem is None else (problem in error)


@pytest.mark.parametrize(("release", "version"), [("6.18.44-fc", (6, 18)), ("4.9", (4, 9)), ("weird", (0, 0))])
def test_kernel_version(release, version):
    assert security.kernel_version(release) == version


def test_an_unknown_apparmor_type_is_refused_not_run_unconfined():
    p = pod(container_sc={"appArmorProfile": {"type": "Complain"}})
    with pytest.raises(SecurityContextError, match="unknown appArmorProfile type 'Complain'"):
        security_context(p, main(p))
