"""A pod's security decisions as the kubelet 1.36 makes them (pure): seccomp and AppArmor profiles, masked /proc
paths, the privileged sandbox, runAsNonRoot, and which sysctls and AppArmor profiles a node may admit."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.util.errors import EdgeletError

from ..cri import runtime_v1_pb2 as pb

# The kubelet's <root-dir>/seccomp: where Localhost seccomp profiles live.
SECCOMP_DIR = "seccomp"

# The deprecated AppArmor annotation the kubelet still reads, after the container's field, before the pod's.
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
APPARMOR_REASON = "AppArmor"  # the kubelet's AppArmorNotAdmittedReason
SYSCTL_REASON = "SysctlForbidden"

# pkg/securitycontext: what a container's /proc hides or keeps read-only unless procMount is Unmasked (the runtime
# drops both for a privileged container).
DEFAULT_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")

# pkg/kubelet/sysctl: the sysctls any pod may set (namespaced, and isolated from other pods), with the kernel that
# namespaced each of the newer ones.
SAFE_SYSCTLS: Mapping[tuple[int, int], tuple[str, ...]] = {
    (0, 0): ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
             "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_keepalive_time",
             "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"),
    (3, 16): ("net.ipv4.ip_local_reserved_ports",),
    (4, 15): ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"),
}

# component-helpers' sysctl namespaces: which kernel namespace isolates a sysctl (unknown ones cannot be allowed).
IPC, NET = "IPC", "Net"
_NAMESPACE_OF_NAME = {name: IPC for name in (
    "kernel.sem", "kernel.shmall", "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced", "kernel.shm",
    "kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.msg")}
_NAMESPACE_OF_PREFIX = {"net": NET, "fs.mqueue": IPC}
_SYSCTL_PATTERN = re.compile(r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*([a-z0-9]([-_a-z0-9]*[a-z0-9])?\*?|\*)$")
_SYSCTL_MAX_CHARS = 253


class SecurityContextError(EdgeletError):
    """The container's security context cannot be given to the runtime: CreateContainerConfigError."""


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """The node's security settings: `seccomp_default` is the kubelet's --seccomp-default, `seccomp_root` its
    <root-dir>/seccomp."""

    seccomp_default: bool = False
    seccomp_root: str = "/var/lib/edgelet/seccomp"


# -- the effective security context ------------------------------------------------------------------------

# The pod-level fields a container inherits when it does not set them
# (securitycontext.DetermineEffectiveSecurityContext).
_INHERITED = ("seLinuxOptions", "runAsUser", "runAsGroup", "runAsNonRoot")


def effective_context(pod: Pod, container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's securityContext with what it leaves unset taken from the pod's."""
    pod_sc = podutil.spec(pod).get("securityContext") or {}
    result = {key: pod_sc[key] for key in _INHERITED if pod_sc.get(key) is not None}
    result.update({key: value for key, value in (container.get("securityContext") or {}).items() if value is not None})
    return result


def _containers_of(pod: Pod) -> tuple[dict[str, Any], ...]:
    """Every container of the pod: init, app and ephemeral ones."""
    return (*podutil.all_containers(pod), *podutil.ephemeral_containers(pod))


def has_privileged_container(pod: Pod) -> bool:
    """Whether any container of the pod is privileged: the sandbox must be then."""
    return any((container.get("securityContext") or {}).get("privileged") is True for container in _containers_of(pod))


def supplemental_groups(pod_sc: Mapping[str, Any]) -> list[int]:
    """The pod's fsGroup (so its containers can use the volumes it owns), then its supplementalGroups."""
    groups = [int(pod_sc["fsGroup"])] if pod_sc.get("fsGroup") is not None else []
    return groups + [int(g) for g in pod_sc.get("supplementalGroups") or []]


def proc_paths(context: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(masked, read-only) /proc paths for a container's effective context: none with procMount Unmasked."""
    if context.get("procMount") == "Unmasked":
        return (), ()
    return DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS


def selinux_option(options: Mapping[str, Any] | None) -> pb.SELinuxOption | None:
    """The CRI form of seLinuxOptions; None when there are none (the runtime labels as it would)."""
    if not options:
        return None
    return pb.SELinuxOption(user=options.get("user") or "", role=options.get("role") or "",
                            type=options.get("type") or "", level=options.get("level") or "")


# -- seccomp ------------------------------------------------------------------------------------------------

def seccomp_profile(pod: Pod, container: Mapping[str, Any], settings: SecuritySettings) -> pb.SecurityProfile:
    """The container's seccomp profile: its own field, else the pod's, else RuntimeDefault with seccomp_default
    and Unconfined without (the kubelet 1.36 no longer reads the seccomp annotations)."""
    profile = (container.get("securityContext") or {}).get("seccompProfile")
    if profile is None:
        profile = (podutil.spec(pod).get("securityContext") or {}).get("seccompProfile")
    if profile is None:
        kind = "RuntimeDefault" if settings.seccomp_default else "Unconfined"
        return pb.SecurityProfile(profile_type=getattr(pb.SecurityProfile, kind))
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault)
    if kind == "Localhost":
        name = profile.get("localhostProfile") or ""
        if not name:
            raise SecurityContextError("localhostProfile must be set if seccompProfile type is Localhost.")
        if os.path.isabs(name) or ".." in name.split("/"):
            raise SecurityContextError(f"seccompProfile.localhostProfile {name!r} must be a descending relative path")
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost,
                                  localhost_ref=os.path.join(settings.seccomp_root, name))
    if kind == "Unconfined":
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)
    raise SecurityContextError(f"unknown seccompProfile type {kind!r}: RuntimeDefault, Localhost or Unconfined")


# -- AppArmor -----------------------------------------------------------------------------------------------

def _annotation_profile(pod: Pod, name: str) -> dict[str, str] | None:
    value = podutil.annotations(pod).get(APPARMOR_ANNOTATION_PREFIX + name)
    if value == "runtime/default":
        return {"type": "RuntimeDefault"}
    if value == "unconfined":
        return {"type": "Unconfined"}
    if value and value.startswith("localhost/"):
        return {"type": "Localhost", "localhostProfile": value[len("localhost/"):]}
    return None


def apparmor_choice(pod: Pod, container: Mapping[str, Any]) -> dict[str, Any] | None:
    """The AppArmor profile a container asks for: its field, else its annotation, else the pod's field."""
    own = (container.get("securityContext") or {}).get("appArmorProfile")
    if own is not None:
        return own
    annotated = _annotation_profile(pod, container.get("name", ""))
    if annotated is not None:
        return annotated
    return (podutil.spec(pod).get("securityContext") or {}).get("appArmorProfile")


def apparmor_profile(pod: Pod, container: Mapping[str, Any]) -> tuple[pb.SecurityProfile, str] | None:
    """The CRI AppArmor profile and the same in the deprecated string form the kubelet still sends for older
    runtimes; None when nothing is asked (the runtime then picks its default)."""
    profile = apparmor_choice(pod, container)
    if profile is None:
        return None
    kind = profile.get("type")
    if kind == "Localhost":
        name = profile.get("localhostProfile") or ""
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost, localhost_ref=name), "localhost/" + name
    if kind not in ("RuntimeDefault", "Unconfined"):
        raise SecurityContextError(f"unknown appArmorProfile type {kind!r}: RuntimeDefault, Localhost or Unconfined")
    deprecated = "runtime/default" if kind == "RuntimeDefault" else "unconfined"
    return pb.SecurityProfile(profile_type=getattr(pb.SecurityProfile, kind)), deprecated


def apparmor_refusal(pod: Pod, host_enabled: bool) -> str:
    """Why the node cannot enforce the AppArmor profiles a pod asks for ("" when it can), as the kubelet's
    admission: anything but Unconfined needs AppArmor on the host; a Localhost profile needs a name."""
    choices = [apparmor_choice(pod, container) for container in _containers_of(pod)]
    pod_choice = (podutil.spec(pod).get("securityContext") or {}).get("appArmorProfile")
    required = any(c is not None and c.get("type") != "Unconfined" for c in (pod_choice, *choices)) or any(
        key.startswith(APPARMOR_ANNOTATION_PREFIX) and value != "unconfined"
        for key, value in podutil.annotations(pod).items())
    if not required:
        return ""
    if not host_enabled:
        return "Cannot enforce AppArmor: AppArmor is not enabled on the host"
    for choice in choices:
        if choice is not None and choice.get("type") == "Localhost" and not (choice.get("localhostProfile")
                                                                             or "").strip():
            return f"Cannot enforce AppArmor: invalid empty AppArmor profile name: {choice!r}"
    return ""


# -- runAsNonRoot -------------------------------------------------------------------------------------------

def run_as_non_root_error(pod: Pod, container: Mapping[str, Any], image_uid: int | None, image_user: str) -> str:
    """The kubelet's refusal of a container whose effective user would be root under runAsNonRoot ("" if none).
    `image_uid`/`image_user` are the image's user as the runtime reports it (neither: root)."""
    context = effective_context(pod, container)
    if context.get("runAsNonRoot") is not True:
        return ""
    who = f'(pod: "{podutil.name(pod)}_{podutil.namespace(pod)}({podutil.uid(pod)})", container: {container["name"]})'
    if context.get("runAsUser") is not None:
        return f"container's runAsUser breaks non-root policy {who}" if int(context["runAsUser"]) == 0 else ""
    if image_uid is None and image_user:
        return (f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                f"cannot verify user is non-root {who}")
    if not image_uid:
        return f"container has runAsNonRoot and image will run as root {who}"
    return ""


def needs_image_user(pod: Pod, container: Mapping[str, Any]) -> bool:
    """Whether the runAsNonRoot check needs the image's user (the runtime is asked only then)."""
    context = effective_context(pod, container)
    return context.get("runAsNonRoot") is True and context.get("runAsUser") is None


# -- sysctls ------------------------------------------------------------------------------------------------

def normalize_sysctl(name: str) -> str:
    """`net/ipv4/conf/eth0.100/rp_filter` -> `net.ipv4.conf.eth0/100.rp_filter`, as the kubelet compares them."""
    separator = re.search(r"[./]", name)
    if separator is None or separator.group() == ".":
        return name
    return name.translate(str.maketrans("./", "/."))


def _namespace_of(name: str) -> str:
    if name in _NAMESPACE_OF_NAME:
        return _NAMESPACE_OF_NAME[name]
    return next((ns for prefix, ns in _NAMESPACE_OF_PREFIX.items() if name.startswith(prefix + ".")), "")


@dataclass(frozen=True, slots=True)
class SysctlAllowlist:
    """Sysctls (exact names) and patterns (prefixes, from a trailing `*`) a pod may set, with their namespace."""

    names: Mapping[str, str] = field(default_factory=dict)
    prefixes: Mapping[str, str] = field(default_factory=dict)


def sysctl_pattern_error(pattern: str) -> str | None:
    """Why `pattern` cannot be in allowed_unsafe_sysctls (None when it can)."""
    if len(pattern) > _SYSCTL_MAX_CHARS or not _SYSCTL_PATTERN.match(pattern):
        return f"sysctl {pattern!r} must have at most {_SYSCTL_MAX_CHARS} characters and be a sysctl name or prefix.*"
    name = normalize_sysctl(pattern).split("*", 1)[0]
    if not _namespace_of(name):
        return f'the sysctls "{name}" are not known to be namespaced'
    return None


def sysctl_allowlist(allowed_unsafe: tuple[str, ...] | list[str], kernel: tuple[int, int]) -> SysctlAllowlist:
    """The safe sysctls this kernel namespaces plus the node's allowed unsafe ones (checked beforehand with
    sysctl_pattern_error)."""
    names: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    safe = [name for since, names in SAFE_SYSCTLS.items() if kernel >= since for name in names]
    for pattern in (*safe, *allowed_unsafe):
        normalized = normalize_sysctl(pattern)
        if "*" in normalized:
            prefix = normalized.split("*", 1)[0]
            prefixes[prefix] = _namespace_of(prefix)
        else:
            names[normalized] = _namespace_of(normalized)
    return SysctlAllowlist(names, prefixes)


def _sysctl_error(name: str, allowlist: SysctlAllowlist, host_network: bool, host_ipc: bool) -> str:
    name = normalize_sysctl(name)
    namespace = allowlist.names.get(name)
    if namespace is None:
        namespace = next((ns for prefix, ns in allowlist.prefixes.items() if name.startswith(prefix)), None)
    if namespace is None:
        return f'"{name}" not allowlisted'
    if (namespace == IPC and host_ipc) or (namespace == NET and host_network):
        return f'"{name}" not allowed with host {namespace} enabled'
    return ""


def sysctl_refusal(pod: Pod, allowlist: SysctlAllowlist) -> str:
    """The kubelet's message refusing the first sysctl of the pod it may not set ("" when all are allowed)."""
    spec = podutil.spec(pod)
    for sysctl in (spec.get("securityContext") or {}).get("sysctls") or []:
        problem = _sysctl_error(str(sysctl.get("name", "")), allowlist, bool(spec.get("hostNetwork")),
                                bool(spec.get("hostIPC")))
        if problem:
            return f"forbidden sysctl: {problem}"
    return ""


def kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a kernel release string such as `6.1.0-18-arm64`; (0, 0) when unreadable."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
