"""Builds the CRI PodSandboxConfig of a pod (pure): metadata, kubelet labels, log directory, network mode, DNS,
security context."""

from __future__ import annotations

import os
from collections.abc import Sequence

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.container import labels

from ..cri import runtime_v1_pb2 as pb
from . import security

NAMESPACE_POD, NAMESPACE_CONTAINER, NAMESPACE_NODE = pb.POD, pb.CONTAINER, pb.NODE  # runtime.v1.NamespaceMode

_PROTOCOLS = {"TCP": pb.TCP, "UDP": pb.UDP, "SCTP": pb.SCTP}


def pod_log_dir(logs_root: str, pod: Pod) -> str:
    """The kubelet's per-pod log directory: `<root>/<namespace>_<name>_<uid>`."""
    return os.path.join(
        logs_root, f"{podutil.namespace(pod)}_{podutil.name(pod)}_{podutil.uid(pod)}"
    )


def sandbox_labels(pod: Pod) -> dict[str, str]:
    result = {k: str(v) for k, v in (podutil.meta(pod).get("labels") or {}).items()}
    result.update(
        {
            labels.POD_NAME: podutil.name(pod),
            labels.POD_NAMESPACE: podutil.namespace(pod),
            labels.POD_UID: podutil.uid(pod),
            labels.MANAGED_BY: "edgelet",
        }
    )
    return result


def port_mappings(pod: Pod) -> list[pb.PortMapping]:
    mappings = []
    for container in podutil.containers(pod):
        for port in container.get("ports") or []:
            host_port = port.get("hostPort") or 0
            if not host_port and not podutil.host_network(pod):
                continue  # the kubelet only maps ports that ask for a host port
            mappings.append(
                pb.PortMapping(
                    protocol=_PROTOCOLS.get(port.get("protocol") or "TCP", pb.TCP),
                    container_port=int(port.get("containerPort") or 0),
                    host_port=int(host_port),
                    host_ip=port.get("hostIP") or "",
                )
            )
    return mappings


def dns_config(pod: Pod, cluster_dns: list[str], cluster_domain: str) -> pb.DNSConfig | None:
    """ClusterFirst pods use the cluster DNS when one is configured; otherwise the host's resolv.conf."""
    spec = podutil.spec(pod)
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    custom = spec.get("dnsConfig") or {}
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    if policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not podutil.host_network(pod)):
        if cluster_dns:
            ns = podutil.namespace(pod)
            servers = list(cluster_dns)
            searches = [f"{ns}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain]
            options = ["ndots:5"]
    elif policy == "None":
        servers, searches = [], []
    servers += list(custom.get("nameservers") or [])
    searches += list(custom.get("searches") or [])
    for option in custom.get("options") or []:
        value = option.get("value")
        options.append(f"{option['name']}:{value}" if value else option["name"])
    if not (servers or searches or options):
        return None
    return pb.DNSConfig(servers=servers, searches=searches, options=options)


def sandbox_security_context(pod: Pod, namespace_options: pb.NamespaceOption) -> pb.LinuxSandboxSecurityContext:
    """As the kubelet's: privileged when any container is (the runtime refuses a privileged container in a sandbox
    that is not), RuntimeDefault seccomp whatever the pod asks (its containers get their own), the pod's users,
    groups and SELinux options."""
    pod_sc = podutil.spec(pod).get("securityContext") or {}
    result = pb.LinuxSandboxSecurityContext(
        namespace_options=namespace_options,
        privileged=security.has_privileged_container(pod),
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault),
        supplemental_groups=security.supplemental_groups(pod_sc),
    )
    if pod_sc.get("runAsUser") is not None:
        result.run_as_user.value = int(pod_sc["runAsUser"])
    if pod_sc.get("runAsGroup") is not None:
        result.run_as_group.value = int(pod_sc["runAsGroup"])
    if (selinux := security.selinux_option(pod_sc.get("seLinuxOptions"))) is not None:
        result.selinux_options.CopyFrom(selinux)
    return result


def make_sandbox_config(
    pod: Pod,
    attempt: int,
    *,
    logs_root: str,
    cluster_dns: Sequence[str] = (),
    cluster_domain: str = "cluster.local",
    cgroup_parent: str = "",
) -> pb.PodSandboxConfig:
    spec = podutil.spec(pod)
    host_network = podutil.host_network(pod)
    namespace_options = pb.NamespaceOption(
        network=NAMESPACE_NODE if host_network else NAMESPACE_POD,
        pid=NAMESPACE_NODE if spec.get("hostPID")
        else NAMESPACE_POD if spec.get("shareProcessNamespace") else NAMESPACE_CONTAINER,
        ipc=NAMESPACE_NODE if spec.get("hostIPC") else NAMESPACE_POD,
    )
    hostname = "" if host_network else podutil.hostname(pod)  # host network: the runtime keeps the node's
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(
            name=podutil.name(pod),
            uid=podutil.uid(pod),
            namespace=podutil.namespace(pod),
            attempt=attempt,
        ),
        hostname=hostname,
        log_directory=pod_log_dir(logs_root, pod),
        port_mappings=port_mappings(pod),
        labels=sandbox_labels(pod),
        annotations={k: str(v) for k, v in podutil.annotations(pod).items()},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=sandbox_security_context(pod, namespace_options),
            sysctls={
                s["name"]: str(s.get("value", ""))
                for s in (spec.get("securityContext") or {}).get("sysctls") or []
            },
        ),
    )
    dns = dns_config(pod, list(cluster_dns), cluster_domain)
    if dns is not None:
        config.dns_config.CopyFrom(dns)
    return config
