"""The managed /etc/hosts, byte for byte as the kubelet writes it, and how it is written."""

from __future__ import annotations

import os

import pytest

from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.volumes.hosts import pod_hostname_and_domain, pod_hosts_file, write_hosts_file

LOCALHOST = (
    "# Kubernetes-managed hosts file.\n"
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)


def _pod(**spec):
    return {"metadata": {"name": "web-0", "namespace": "prod"}, "spec": spec}


@pytest.mark.parametrize(
    ("pod", "ips", "expected"),
    [
        (_pod(), ["10.88.0.5"], LOCALHOST + "10.88.0.5\tweb-0\n"),
        (_pod(hostname="db", subdomain="backend"), ["10.88.0.5", "fd00::5"],
         LOCALHOST + "10.88.0.5\tdb.backend.prod.svc.cluster.local\tdb\n"
                     "fd00::5\tdb.backend.prod.svc.cluster.local\tdb\n"),
        (_pod(hostAliases=[{"ip": "192.0.2.1", "hostnames": ["a.example", "b.example"]},
                           {"ip": "192.0.2.2", "hostnames": ["c.example"]}]), ["10.88.0.5"],
         LOCALHOST + "10.88.0.5\tweb-0\n\n# Entries added by HostAliases.\n"
                     "192.0.2.1\ta.example\tb.example\n192.0.2.2\tc.example\n"),
        (_pod(hostNetwork=True, hostAliases=[{"ip": "192.0.2.1", "hostnames": ["a.example"]}]), [],
         "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost node\n"
         "\n# Entries added by HostAliases.\n192.0.2.1\ta.example\n"),
    ],
)
def test_hosts_file_content(pod, ips, expected):
    assert pod_hosts_file(pod, ips, "cluster.local", "127.0.0.1 localhost node\n") == expected


def test_long_hostnames_are_cut_to_63_characters_without_trailing_dashes():
    pod = {"metadata": {"name": "a" * 62 + "-b" + "c" * 10, "namespace": "ns"}, "spec": {}}
    assert pod_hostname_and_domain(pod, "cluster.local") == ("a" * 62, "")


def test_a_hosts_file_is_replaced_whole_without_fsync_and_a_damaged_one_is_rewritten(tmp_path, monkeypatch):
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    path = str(tmp_path / "etc-hosts")
    assert write_hosts_file(path, b"127.0.0.1 localhost\n") is True
    assert write_hosts_file(path, b"127.0.0.1 localhost\n") is False  # the same content: left alone
    open(path, "wb").close()  # what a power cut may leave of an unsynced file
    assert write_hosts_file(path, b"127.0.0.1 localhost\n") is True  # checked before every mount, so rewritten
    assert open(path, "rb").read() == b"127.0.0.1 localhost\n" and os.listdir(tmp_path) == ["etc-hosts"]
    assert fsyncs == []  # rewritten before any container mounts it again: no journal commits on the runtime's disk


@pytest.mark.parametrize("spec, expected", [
    # The upstream "Override hostname of Pod" cases: the override wins over hostname and subdomain, no domain.
    ({"hostnameOverride": "override.example.host"}, ("override.example.host", "")),
    ({"hostname": "custom-host", "hostnameOverride": "override-host"}, ("override-host", "")),
    ({"subdomain": "t", "hostnameOverride": "override-host"}, ("override-host", "")),
    ({"hostname": "custom-host", "subdomain": "t"}, ("custom-host", "t.ns.svc.cluster.local")),
    ({}, ("p", "")),
])
def test_hostname_override(spec, expected):
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    assert pod_hostname_and_domain(pod, "cluster.local") == expected
    assert make_sandbox_config(pod, 0, logs_root="/logs").hostname == expected[0]
