"""The pod's managed /etc/hosts: its hostname and domain and the file the kubelet writes (pure), and the crash-safe
write of that file under the pod's directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.util.checkpoint import replace_file

MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
MANAGED_HEADER_HOST_NETWORK = "# Kubernetes-managed hosts file (host network).\n"
TEMP_SUFFIX = ".tmp"


def pod_hostname_and_domain(pod: Pod, cluster_domain: str) -> tuple[str, str]:
    """The pod's hostname (podutil.hostname), and `<subdomain>.<ns>.svc.<domain>`; a hostnameOverride has no
    domain, as in the kubelet."""
    spec = podutil.spec(pod)
    subdomain = spec.get("subdomain")
    if spec.get("hostnameOverride") or not subdomain:
        return podutil.hostname(pod), ""
    return podutil.hostname(pod), f"{subdomain}.{podutil.namespace(pod)}.svc.{cluster_domain}"


def _alias_entries(aliases: list[dict[str, Any]] | None) -> str:
    if not aliases:
        return ""
    lines = ["", "# Entries added by HostAliases."]
    lines += [f"{alias.get('ip', '')}\t" + "\t".join(alias.get("hostnames") or []) for alias in aliases]
    return "\n".join(lines) + "\n"


def managed_hosts(pod_ips: Sequence[str], hostname: str, domain: str,
                  aliases: list[dict[str, Any]] | None = None) -> str:
    """The hosts file of a pod on the pod network: loopback entries, the pod's IPs, host aliases."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
    ]
    for ip in pod_ips:
        lines.append(f"{ip}\t{hostname}.{domain}\t{hostname}" if domain else f"{ip}\t{hostname}")
    return MANAGED_HEADER + "\n".join(lines) + "\n" + _alias_entries(aliases)


def host_network_hosts(node_hosts: str, aliases: list[dict[str, Any]] | None = None) -> str:
    """The hosts file of a host-network pod: the node's own, plus host aliases."""
    return MANAGED_HEADER_HOST_NETWORK + node_hosts + _alias_entries(aliases)


def pod_hosts_file(pod: Pod, pod_ips: Sequence[str], cluster_domain: str, node_hosts: str | None) -> str:
    """The /etc/hosts content for the pod; `node_hosts` is the node's file, read for host-network pods."""
    aliases = podutil.spec(pod).get("hostAliases")
    if podutil.host_network(pod):
        return host_network_hosts(node_hosts or "", aliases)
    hostname, domain = pod_hostname_and_domain(pod, cluster_domain)
    return managed_hosts(pod_ips, hostname, domain, aliases)


def write_hosts_file(path: str, content: bytes) -> bool:
    """Makes `path` hold `content`: a temp file renamed over it, so a reader or a full disk sees the old file or
    the new one, never half of one. A file that differs (damaged, or the pod's IPs changed) is replaced; returns
    whether it was. Containers already running keep the inode they mounted.

    Not fsynced (the kubelet does not either): the file is compared before every container start that mounts
    it, and a power cut stops every container, so what a power cut leaves (the old bytes, or an empty file) is
    replaced before anything mounts it again. Two fsyncs a pod were two journal commits on the runtime's disk,
    in the middle of a burst of its own commits.
    """
    try:
        with open(path, "rb") as stream:
            if stream.read(len(content) + 1) == content:
                return False
    except (FileNotFoundError, IsADirectoryError):
        pass
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)  # an empty directory in its place (left by a bad mount): the file goes there
    # One fixed temp name, so writes of one file must not overlap (the volume manager makes them take turns): what
    # a crash leaves is overwritten by the next write and removed with the pod directory.
    replace_file(path, content, temp=path + TEMP_SUFFIX, mode=0o644, exclusive=False, durable=False)
    return True
