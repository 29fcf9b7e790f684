"""Builds the CRI ContainerConfig of one container (pure): command, env, mounts, resources, kubelet labels."""

from __future__ import annotations

from typing import Any, cast

import orjson

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.container import labels

from ..cri import runtime_v1_pb2 as pb
from . import security
from .security import SecuritySettings

_PROPAGATION = {"None": pb.PROPAGATION_PRIVATE, "HostToContainer": pb.PROPAGATION_HOST_TO_CONTAINER,
                "Bidirectional": pb.PROPAGATION_BIDIRECTIONAL}


def container_log_path(container_name: str, restart_count: int) -> str:
    """Relative to the sandbox's log directory, as the kubelet lays it out."""
    return f"{container_name}/{restart_count}.log"


def container_labels(pod: Pod, container_name: str) -> dict[str, str]:
    return {
        labels.POD_NAME: podutil.name(pod),
        labels.POD_NAMESPACE: podutil.namespace(pod),
        labels.POD_UID: podutil.uid(pod),
        labels.CONTAINER_NAME: container_name,
        labels.MANAGED_BY: "edgelet",
    }


def container_annotations(pod: Pod, container: dict, *, container_hash: str, restart_count: int) -> dict[str, str]:
    result = {
        labels.CONTAINER_HASH: container_hash,
        labels.CONTAINER_RESTART_COUNT: str(restart_count),
        labels.TERMINATION_GRACE_PERIOD: str(podutil.grace_period_seconds(pod)),
        labels.CONTAINER_TERMINATION_MESSAGE_PATH: container.get("terminationMessagePath")
        or "/dev/termination-log",
        labels.CONTAINER_TERMINATION_MESSAGE_POLICY: container.get("terminationMessagePolicy") or "File",
    }
    ports = container.get("ports")
    if ports:
        result[labels.CONTAINER_PORTS] = orjson.dumps(ports).decode()
    pre_stop = (container.get("lifecycle") or {}).get("preStop")
    if pre_stop:
        result[labels.CONTAINER_PRESTOP_HANDLER] = orjson.dumps(pre_stop).decode()
    return result


# CRI NamespaceMode values.
NAMESPACE_POD, NAMESPACE_CONTAINER, NAMESPACE_NODE, NAMESPACE_TARGET = pb.POD, pb.CONTAINER, pb.NODE, pb.TARGET


def security_context(pod: Pod, container: dict, pid_target: str = "", *,
                     settings: SecuritySettings = SecuritySettings(),
                     image_user: tuple[int | None, str] = (None, "")) -> pb.LinuxContainerSecurityContext:
    """The container's CRI security context, as the kubelet's determineEffectiveSecurityContext. `pid_target` (an
    ephemeral container's target) puts it into that container's PID namespace, as the kubelet does when the pod
    has no shared or host PID namespace; `image_user` is the image's (uid, username), the user when the pod
    names none. Raises SecurityContextError when the context cannot be given to the runtime."""
    pod_sc = podutil.spec(pod).get("securityContext") or {}
    sc = security.effective_context(pod, container)
    masked, readonly = security.proc_paths(sc)
    result = pb.LinuxContainerSecurityContext(
        privileged=bool(sc.get("privileged")),
        readonly_rootfs=bool(sc.get("readOnlyRootFilesystem")),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
        supplemental_groups=security.supplemental_groups(pod_sc),
        # Admission refused Strict where the runtime does not report it can keep it.
        supplemental_groups_policy=pb.Strict if pod_sc.get("supplementalGroupsPolicy") == "Strict" else pb.Merge,
        masked_paths=masked,
        readonly_paths=readonly,
        seccomp=security.seccomp_profile(pod, container, settings),
    )
    if (apparmor := security.apparmor_profile(pod, container)) is not None:
        result.apparmor.CopyFrom(apparmor[0])
        result.apparmor_profile = apparmor[1]
    if (selinux := security.selinux_option(sc.get("seLinuxOptions"))) is not None:
        result.selinux_options.CopyFrom(selinux)
    run_as_user = sc.get("runAsUser")
    if run_as_user is not None:
        result.run_as_user.value = int(run_as_user)
    elif image_user[0] is not None:
        result.run_as_user.value = image_user[0]
    else:
        result.run_as_username = image_user[1]
    run_as_group = sc.get("runAsGroup")
    if run_as_group is not None:
        result.run_as_group.value = int(run_as_group)
    caps = sc.get("capabilities") or {}
    if caps:
        result.capabilities.add_capabilities.extend(caps.get("add") or [])
        result.capabilities.drop_capabilities.extend(caps.get("drop") or [])
    spec = podutil.spec(pod)
    options = result.namespace_options
    options.network = NAMESPACE_NODE if podutil.host_network(pod) else NAMESPACE_POD
    options.pid = (NAMESPACE_NODE if spec.get("hostPID") else NAMESPACE_POD if spec.get("shareProcessNamespace")
                   else NAMESPACE_CONTAINER)
    if pid_target and options.pid == NAMESPACE_CONTAINER:
        options.pid = NAMESPACE_TARGET
        options.target_id = pid_target
    options.ipc = NAMESPACE_NODE if spec.get("hostIPC") else NAMESPACE_POD
    return result


def make_container_config(
    pod: Pod,
    container: dict,
    *,
    image_ref: str,
    restart_count: int,
    container_hash: str,
    env: list[tuple[str, str]],
    command: list[str],
    args: list[str],
    mounts: list[dict],
    resources: dict | None = None,
    pid_target: str = "",
    settings: SecuritySettings = SecuritySettings(),
    image_user: tuple[int | None, str] = (None, ""),
) -> pb.ContainerConfig:
    name = container["name"]
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=restart_count),
        image=pb.ImageSpec(image=image_ref, user_specified_image=container.get("image", "")),
        command=command,
        args=args,
        working_dir=container.get("workingDir") or "",
        envs=[pb.KeyValue(key=k, value=v) for k, v in env],
        mounts=[
            pb.Mount(
                container_path=m["container_path"],
                host_path=m["host_path"],
                readonly=bool(m.get("readonly")),
                propagation=_PROPAGATION.get(m.get("propagation") or "None", pb.PROPAGATION_PRIVATE)
                if isinstance(m.get("propagation"), str) or m.get("propagation") is None
                else cast("pb.MountPropagation", int(m["propagation"])),  # the volume manager's, by number
            )
            for m in mounts
        ],
        labels=container_labels(pod, name),
        annotations=container_annotations(pod, container, container_hash=container_hash,
                                          restart_count=restart_count),
        log_path=container_log_path(name, restart_count),
        stdin=bool(container.get("stdin")),
        stdin_once=bool(container.get("stdinOnce")),
        tty=bool(container.get("tty")),
        linux=pb.LinuxContainerConfig(security_context=security_context(pod, container, pid_target, settings=settings,
                                                                       image_user=image_user)),
    )
    if resources:
        config.linux.resources.CopyFrom(pb.LinuxContainerResources(**resources))
    return config


def add_device_options(config: pb.ContainerConfig, options: Any) -> None:
    """Adds what the container's device plugins answered (the kubelet's DeviceRunContainerOptions: `envs`, `mounts`
    and `devices` as tuples, `annotations`, `cdi_devices` names). Their variables and mounts come before the
    container's own, as the kubelet orders them, so the container's own variable of the same name wins; the
    kubelet's annotations win over theirs."""
    own_envs = list(config.envs)
    del config.envs[:]
    config.envs.extend([pb.KeyValue(key=key, value=value) for key, value in options.envs] + own_envs)
    own_mounts = list(config.mounts)
    del config.mounts[:]
    config.mounts.extend([pb.Mount(container_path=container_path, host_path=host_path, readonly=read_only)
                          for container_path, host_path, read_only in options.mounts] + own_mounts)
    config.devices.extend(pb.Device(container_path=container_path, host_path=host_path, permissions=permissions)
                          for container_path, host_path, permissions in options.devices)
    own_annotations = dict(config.annotations)
    config.annotations.clear()
    config.annotations.update({**options.annotations, **own_annotations})
    config.CDI_devices.extend(pb.CDIDevice(name=name) for name in options.cdi_devices)
