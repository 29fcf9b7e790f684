"""What configMap, secret, downwardAPI and projected volumes hold: keys, items, modes, optional sources."""

from __future__ import annotations

import base64

import pytest

from edgelet.api.objectstore import ObjectStore
from edgelet.volumes.atomic_writer import FileProjection
from edgelet.volumes.errors import VolumeError
from edgelet.volumes.projection import volume_payload

POD = {
    "metadata": {"name": "web", "namespace": "prod", "uid": "u-1", "labels": {"app": "web", "tier": "a"},
                 "annotations": {"build": "42"}},
    "spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]},
}


def _store():
    store = ObjectStore()
    store.put({"kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "prod"},
               "data": {"app.conf": "level=debug\n", "extra": "x"},
               "binaryData": {"logo.png": base64.b64encode(b"\x89PNG").decode()}})
    store.put({"kind": "Secret", "metadata": {"name": "tls", "namespace": "prod"},
               "data": {"tls.key": base64.b64encode(b"KEY").decode(), "tls.crt": base64.b64encode(b"CRT").decode()}})
    return store


def _payload(kind, source, warnings=None):
    return volume_payload(POD, kind, source, _store(), {"memory": "2Gi"}, [] if warnings is None else warnings)


@pytest.mark.parametrize(
    ("kind", "source", "expected"),
    [
        ("configMap", {"name": "cfg"},
         {"app.conf": FileProjection(b"level=debug\n", 0o644), "extra": FileProjection(b"x", 0o644),
          "logo.png": FileProjection(b"\x89PNG", 0o644)}),
        ("configMap", {"name": "cfg", "defaultMode": 0o600, "items": [
            {"key": "app.conf", "path": "conf/app.conf"}, {"key": "extra", "path": "e", "mode": 0o755}]},
         {"conf/app.conf": FileProjection(b"level=debug\n", 0o600), "e": FileProjection(b"x", 0o755)}),
        ("configMap", {"name": "cfg", "optional": True, "items": [{"key": "gone", "path": "g"},
                                                                  {"key": "extra", "path": "e"}]},
         {"e": FileProjection(b"x", 0o644)}),
        ("configMap", {"name": "absent", "optional": True}, {}),
        ("secret", {"secretName": "tls"},
         {"tls.key": FileProjection(b"KEY", 0o644), "tls.crt": FileProjection(b"CRT", 0o644)}),
        ("secret", {"secretName": "tls", "defaultMode": 0o400, "items": [{"key": "tls.key", "path": "key"}]},
         {"key": FileProjection(b"KEY", 0o400)}),
        ("secret", {"secretName": "absent", "optional": True}, {}),
        ("downwardAPI", {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "build", "fieldRef": {"fieldPath": "metadata.annotations['build']"}, "mode": 0o400},
            {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "app", "resource": "requests.memory"}}]},
         {"labels": FileProjection(b'app="web"\ntier="a"', 0o644), "build": FileProjection(b"42", 0o400),
          "cpu": FileProjection(b"500", 0o644), "mem": FileProjection(b"67108864", 0o644)}),
        ("projected", {"defaultMode": 0o440, "sources": [
            {"configMap": {"name": "cfg", "items": [{"key": "extra", "path": "extra"}]}},
            {"secret": {"name": "tls", "items": [{"key": "tls.crt", "path": "certs/tls.crt"}]}},
            {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]},
         {"extra": FileProjection(b"x", 0o440), "certs/tls.crt": FileProjection(b"CRT", 0o440),
          "ns": FileProjection(b"prod", 0o440)}),
    ],
)
def test_payloads(kind, source, expected):
    assert _payload(kind, source) == expected


@pytest.mark.parametrize(
    ("kind", "source", "message"),
    [
        ("configMap", {"name": "absent"}, 'configmap "absent" not found'),
        ("secret", {"secretName": "absent"}, 'secret "absent" not found'),
        ("configMap", {"name": "cfg", "items": [{"key": "gone", "path": "g"}]},
         "configmap references non-existent config key: gone"),
        ("secret", {"secretName": "tls", "items": [{"key": "gone", "path": "g"}]},
         "references non-existent secret key: gone"),
        ("projected", {"sources": [{"secret": {"name": "absent"}}]}, 'secret "absent" not found'),
        ("configMap", {"name": "cfg", "defaultMode": 0o1777}, "mode must be a number between 0 and 0777"),
        ("downwardAPI", {"items": [{"path": "x", "fieldRef": {"fieldPath": "spec.nodeName"}}]},
         "unsupported fieldPath: spec.nodeName"),
        ("downwardAPI", {"items": [{"path": "x", "resourceFieldRef": {"resource": "limits.cpu"}}]},
         "container  not found"),
    ],
)
def test_payload_errors(kind, source, message):
    with pytest.raises(VolumeError) as caught:
        _payload(kind, source)
    assert message in caught.value.message


def test_unsupported_projected_sources_are_skipped_with_a_warning():
    warnings: list[str] = []
    payload = _payload("projected", {"sources": [
        {"clusterTrustBundle": {"path": "bundle.pem", "signerName": "example.com/signer"}},
        {"configMap": {"name": "cfg", "items": [{"key": "extra", "path": "ca.crt"}]}}]}, warnings)
    assert payload == {"ca.crt": FileProjection(b"x", 0o644)}
    assert warnings == ["projected source clusterTrustBundle is not supported by this node agent and was skipped"]


KUBE_API_ACCESS = {"defaultMode": 0o644, "sources": [
    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
    {"configMap": {"name": "cfg", "items": [{"key": "extra", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}


def _with_users(pod_user=None, container_users=(), init_users=()):
    def container(name, user):
        return {"name": name, **({"securityContext": {"runAsUser": user}} if user is not None else {})}
    spec = {"containers": [container(f"c{i}", u) for i, u in enumerate(container_users or [None])],
            "initContainers": [container(f"i{i}", u) for i, u in enumerate(init_users)]}
    if pod_user is not None:
        spec["securityContext"] = {"runAsUser": pod_user}
    return {**POD, "spec": spec}


@pytest.mark.parametrize(
    ("pod", "fs_group", "mode", "owner"),
    [
        (POD, None, 0o644, None),  # defaultMode, as kube-api-access asks
        (POD, 2000, 0o600, None),  # fsGroup: 0600, and SetVolumeOwnership adds group read
        (_with_users(pod_user=1000), None, 0o600, 1000),  # every container runs as 1000: it owns the token
        (_with_users(container_users=[1000, 1000], init_users=[1000]), None, 0o600, 1000),
        (_with_users(container_users=[1000, 1001]), None, 0o644, None),  # two users: no owner
        (_with_users(pod_user=1000, init_users=[0]), None, 0o644, None),  # an init container runs as root
    ],
)
def test_the_token_file_mode_follows_the_kubelets_owner_rules(pod, fs_group, mode, owner):
    payload = volume_payload(pod, "projected", KUBE_API_ACCESS, _store(), {}, [], {"token": b"jwt"}, fs_group)
    assert payload["token"] == FileProjection(b"jwt", mode, owner)
    assert payload["ca.crt"] == FileProjection(b"x", 0o644)  # the other sources keep defaultMode
    assert payload["namespace"] == FileProjection(b"prod", 0o644)


def test_a_token_source_without_its_token_is_an_error():
    with pytest.raises(VolumeError, match="no service-account token for path 'token'"):
        volume_payload(POD, "projected", KUBE_API_ACCESS, _store(), {}, [], {}, None)
