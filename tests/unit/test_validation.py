"""Pod validation and quantities: each API-server rule reported at its field path; no input crashes it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgelet.api.quantity import NANO, format_bytes, parse_quantity, to_int_ceil, to_millis_ceil
from edgelet.podconfig.defaults import apply_defaults
from edgelet.podconfig.validation import (
    env_name_error,
    label_value_error,
    port_name_error,
    qualified_name_error,
    validate_pod,
)


def valid_pod() -> dict[str, Any]:
    return apply_defaults({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-node1", "namespace": "default", "labels": {"app": "web"},
                     "annotations": {"example.com/note": "x"}},
        "spec": {
            "initContainers": [{"name": "init", "image": "busybox:1.36", "command": ["true"]}],
            "containers": [{
                "name": "app",
                "image": "busybox:1.36",
                "ports": [{"name": "http", "containerPort": 8080}],
                "env": [{"name": "MODE", "value": "edge"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}],
                "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": 1, "memory": "64Mi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "cfg", "mountPath": "/etc/cfg"}],
                "livenessProbe": {"httpGet": {"port": "http"}},
                "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "successThreshold": 2},
                "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
            }],
            "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                        {"name": "cfg", "configMap": {"name": "web-config"}},
                        {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}}],
        },
    })


def test_valid_pod_has_no_problems():
    assert validate_pod(valid_pod()) == []


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation setting a dotted path ("spec.containers.0.image") to a value; None deletes it."""
    def mutate(pod: dict) -> None:
        *parents, last = path.split(".")
        target: Any = pod
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        key: Any = int(last) if last.isdigit() else last
        if value is None:
            del target[key]
        else:
            target[key] = value
    return mutate


APP = "spec.containers.0"  # the path as _set walks it
C0 = "spec.containers[0]"  # the same container as validation names it

CASES = [
    (_set("metadata.name", "Web"), "metadata.name", "DNS-1123 subdomain"),
    (_set("metadata.name", None), "metadata.name", "non-empty"),
    (_set("metadata.namespace", "kube.system"), "metadata.namespace", "DNS-1123 label"),
    (_set("metadata.labels", {"app": "-bad-"}), "metadata.labels['app']", "label value"),
    (_set("metadata.labels", {"bad key": "x"}), "metadata.labels['bad key']", "qualified name"),
    (_set("metadata.annotations", {"a": 1}), "metadata.annotations['a']", "must be a string"),
    (_set("spec", None), "spec", "is required"),
    (_set("spec.containers", []), "spec.containers", "at least one container"),
    (_set("spec.containers", "app"), "spec.containers", "at least one container"),
    (_set(f"{APP}.name", "App_1"), f"{C0}.name", "DNS-1123 label"),
    (_set(f"{APP}.name", "init"), f"{C0}.name", "duplicate container name 'init'"),
    (_set(f"{APP}.image", ""), f"{C0}.image", "is required"),
    (_set(f"{APP}.image", None), f"{C0}.image", "is required"),
    (_set(f"{APP}.imagePullPolicy", "Sometimes"), f"{C0}.imagePullPolicy", "Always, IfNotPresent, Never"),
    (_set("spec.restartPolicy", "Forever"), "spec.restartPolicy", "Always, OnFailure, Never"),
    (_set(f"{APP}.restartPolicy", "Always"), f"{C0}.restartPolicy", "only be set on init"),
    (_set("spec.initContainers.0.restartPolicy", "Never"), "spec.initContainers[0].restartPolicy", "Always"),
    (_set(f"{APP}.ports.0.containerPort", 0), f"{C0}.ports[0].containerPort", "between 1 and 65535"),
    (_set(f"{APP}.ports.0.containerPort", 70000), f"{C0}.ports[0].containerPort", "between 1 and 65535"),
    (_set(f"{APP}.ports.0.containerPort", "80"), f"{C0}.ports[0].containerPort", "port number"),
    (_set(f"{APP}.ports.0.protocol", "HTTP"), f"{C0}.ports[0].protocol", "TCP, UDP, SCTP"),
    (_set(f"{APP}.ports.0.name", "HTTP"), f"{C0}.ports[0].name", "port name"),
    (_set(f"{APP}.ports.0.hostPort", 70000), f"{C0}.ports[0].hostPort", "between 0 and 65535"),
    (_set(f"{APP}.ports", [{"containerPort": 1, "hostPort": 80, "protocol": "TCP"},
                           {"containerPort": 2, "hostPort": 80, "protocol": "TCP"}]),
     f"{C0}.ports[1].hostPort", "already used"),
    (_set(f"{APP}.livenessProbe", {"httpGet": {"port": 80}, "exec": {"command": ["true"]}}),
     f"{C0}.livenessProbe", "exactly one handler"),
    (_set(f"{APP}.livenessProbe", {"periodSeconds": 5}), f"{C0}.livenessProbe", "found none"),
    (_set(f"{APP}.livenessProbe.successThreshold", 2), f"{C0}.livenessProbe.successThreshold", "must be 1"),
    (_set(f"{APP}.livenessProbe.periodSeconds", 0), f"{C0}.livenessProbe.periodSeconds", "at least 1"),
    (_set(f"{APP}.readinessProbe.exec.command", []), f"{C0}.readinessProbe.exec.command", "non-empty"),
    (_set(f"{APP}.startupProbe", {"tcpSocket": {"port": 0}}), f"{C0}.startupProbe.tcpSocket.port", "1 and 65535"),
    (_set(f"{APP}.startupProbe", {"grpc": {"port": "grpc"}}), f"{C0}.startupProbe.grpc.port", "port number"),
    (_set(f"{APP}.livenessProbe.httpGet.scheme", "FTP"), f"{C0}.livenessProbe.httpGet.scheme", "HTTP, HTTPS"),
    (_set("spec.initContainers.0.readinessProbe", {"exec": {"command": ["true"]}}),
     "spec.initContainers[0].readinessProbe", "init containers"),
    (_set(f"{APP}.lifecycle.preStop", {}), f"{C0}.lifecycle.preStop", "exactly one handler"),
    (_set(f"{APP}.env.0.name", "A=B"), f"{C0}.env[0].name", "environment variable"),
    (_set(f"{APP}.env.0.name", ""), f"{C0}.env[0].name", "non-empty"),
    (_set(f"{APP}.env.0.value", 1), f"{C0}.env[0].value", "must be a string"),
    (_set(f"{APP}.env.1.valueFrom.fieldRef.fieldPath", "spec.secret"),
     f"{C0}.env[1].valueFrom.fieldRef.fieldPath", "unsupported field path"),
    (_set(f"{APP}.env.1.valueFrom", {}), f"{C0}.env[1].valueFrom", "exactly one source"),
    (_set(f"{APP}.env.1.valueFrom", {"secretKeyRef": {"name": "s"}}),
     f"{C0}.env[1].valueFrom.secretKeyRef.key", "not a valid key"),
    (_set(f"{APP}.envFrom", [{"prefix": "X_"}]), f"{C0}.envFrom[0]", "exactly one source"),
    (_set(f"{APP}.resources.limits.cpu", "1 core"), f"{C0}.resources.limits.cpu", "does not match"),
    (_set(f"{APP}.resources.requests.memory", "-1Mi"), f"{C0}.resources.requests.memory", "negative"),
    (_set(f"{APP}.resources.requests.memory", "128Mi"), f"{C0}.resources.requests.memory", "memory limit"),
    (_set(f"{APP}.resources.limits.gpu", "1"), f"{C0}.resources.limits.gpu", "unknown resource"),
    (_set(f"{APP}.volumeMounts.0.name", "nope"), f"{C0}.volumeMounts[0].name", "not defined"),
    (_set(f"{APP}.volumeMounts.1.mountPath", "/data"), f"{C0}.volumeMounts[1].mountPath", "mounted twice"),
    (_set(f"{APP}.volumeMounts.0.subPath", "../x"), f"{C0}.volumeMounts[0].subPath", "'..'"),
    (_set(f"{APP}.volumeMounts.0.mountPropagation", "Both"), f"{C0}.volumeMounts[0].mountPropagation",
     "None, HostToContainer, Bidirectional"),
    (_set("spec.volumes.1.name", "data"), "spec.volumes[1].name", "duplicate volume name"),
    (_set("spec.volumes.0.hostPath", {"path": "/x"}), "spec.volumes[0]", "exactly one volume source"),
    (_set("spec.volumes.0.emptyDir", None), "spec.volumes[0]", "found none"),
    (_set("spec.volumes.0.hostpath", {"path": "/x"}), "spec.volumes[0].hostpath", "unknown volume source"),
    (_set("spec.volumes.2.hostPath.path", "var/log"), "spec.volumes[2].hostPath.path", "absolute"),
    (_set("spec.volumes.2.hostPath.type", "Dir"), "spec.volumes[2].hostPath.type", "must be one of"),
    (_set("spec.volumes.1.configMap.items", [{"key": "a", "path": "/abs"}]), "spec.volumes[1].configMap.items[0].path",
     "relative"),
    (_set("spec.volumes.1.configMap.defaultMode", 0o1777), "spec.volumes[1].configMap.defaultMode",
     "between 0 and 511"),
    (_set("spec.volumes.0.emptyDir.sizeLimit", "lots"), "spec.volumes[0].emptyDir.sizeLimit", "does not match"),
    (_set("spec.dnsPolicy", "Cluster"), "spec.dnsPolicy", "ClusterFirst"),
    (_set("spec.dnsPolicy", "None"), "spec.dnsConfig.nameservers", "at least one nameserver"),
    (_set("spec.dnsConfig", {"nameservers": ["8.8.8"]}), "spec.dnsConfig.nameservers[0]", "not an IP"),
    (_set("spec.terminationGracePeriodSeconds", -1), "spec.terminationGracePeriodSeconds", "at least 0"),
    (_set("spec.activeDeadlineSeconds", 0), "spec.activeDeadlineSeconds", "at least 1"),
    (_set("spec.hostname", "my_host"), "spec.hostname", "DNS-1123 label"),
    (_set("spec.securityContext", {"runAsUser": -1}), "spec.securityContext.runAsUser", "between 0"),
    (_set("spec.volumes", "data"), "spec.volumes", "must be a list"),
    (_set(f"{APP}.command", "sleep 1"), f"{C0}.command", "list of strings"),
    # Security contexts: a wrong type must not run the container less confined than asked.
    (_set(f"{APP}.securityContext", {"privileged": "false"}), f"{C0}.securityContext.privileged", "true or false"),
    (_set(f"{APP}.securityContext", {"runAsUser": -1}), f"{C0}.securityContext.runAsUser", "between 0 and"),
    (_set(f"{APP}.securityContext", {"procMount": "Hidden"}), f"{C0}.securityContext.procMount", "Default, Unmasked"),
    (_set(f"{APP}.securityContext", {"seccompProfile": {"type": "Permissive"}}),
     f"{C0}.securityContext.seccompProfile.type", "RuntimeDefault, Unconfined, Localhost"),
    (_set(f"{APP}.securityContext", {"seccompProfile": {"type": "Localhost"}}),
     f"{C0}.securityContext.seccompProfile.localhostProfile", "non-empty relative path"),
    (_set(f"{APP}.securityContext", {"seccompProfile": {"type": "Localhost", "localhostProfile": "../x.json"}}),
     f"{C0}.securityContext.seccompProfile.localhostProfile", "must not contain '..'"),
    (_set("spec.securityContext", {"appArmorProfile": {"type": "Unconfined", "localhostProfile": "p"}}),
     "spec.securityContext.appArmorProfile.localhostProfile", "only be set with type Localhost"),
    (_set("spec.securityContext", {"seLinuxOptions": {"level": 0}}), "spec.securityContext.seLinuxOptions.level",
     "must be a string"),
    (_set("spec.securityContext", {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": 1}]}),
     "spec.securityContext.sysctls[0]", "both strings"),
]


@pytest.mark.parametrize(("mutate", "path", "fragment"), CASES, ids=[case[1] + ":" + case[2] for case in CASES])
def test_problem_is_reported_at_its_field(mutate, path, fragment):
    pod = valid_pod()
    mutate(pod)
    problems = validate_pod(pod)
    assert any(p == path and fragment in message for p, message in problems), problems


def test_host_network_requires_matching_host_port():
    pod = valid_pod()
    pod["spec"]["hostNetwork"] = True
    pod["spec"]["containers"][0]["ports"][0]["hostPort"] = 9090
    expected = ("spec.containers[0].ports[0].hostPort", "must match containerPort when hostNetwork is true")
    assert expected in validate_pod(pod)


def test_sidecar_init_container_may_have_probes():
    pod = valid_pod()
    init = pod["spec"]["initContainers"][0]
    init["restartPolicy"] = "Always"
    init["readinessProbe"] = {"exec": {"command": ["true"]}, "periodSeconds": 10}
    assert validate_pod(pod) == []


def ephemeral_pod(**fields):
    pod = valid_pod()
    target = pod["spec"]["containers"][0]["name"]
    pod["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox:1", "imagePullPolicy": "IfNotPresent",
                                           "terminationMessagePolicy": "File", "targetContainerName": target,
                                           "stdin": True, "tty": True, **fields}]
    return pod


def test_ephemeral_container_is_valid():
    assert validate_pod(ephemeral_pod()) == []


@pytest.mark.parametrize(
    ("fields", "path", "fragment"),
    [
        ({"ports": [{"containerPort": 80, "protocol": "TCP"}]}, "spec.ephemeralContainers[0].ports", "ephemeral"),
        ({"readinessProbe": {"exec": {"command": ["true"]}}}, "spec.ephemeralContainers[0].readinessProbe",
         "ephemeral"),
        ({"resources": {"limits": {"cpu": "1"}}}, "spec.ephemeralContainers[0].resources", "ephemeral"),
        ({"targetContainerName": "nope"}, "spec.ephemeralContainers[0].targetContainerName", "'nope'"),
        ({"image": ""}, "spec.ephemeralContainers[0].image", "required"),
    ],
)
def test_ephemeral_container_problems(fields, path, fragment):
    problems = validate_pod(ephemeral_pod(**fields))
    assert any(p == path and fragment in message for p, message in problems), problems


def test_ephemeral_container_name_must_be_unique():
    pod = ephemeral_pod()
    pod["spec"]["ephemeralContainers"][0]["name"] = pod["spec"]["containers"][0]["name"]
    assert any(p == "spec.ephemeralContainers[0].name" and "duplicate" in m for p, m in validate_pod(pod))


@pytest.mark.parametrize(
    ("check", "value", "ok"),
    [
        (qualified_name_error, "app", True), (qualified_name_error, "example.com/app", True),
        (qualified_name_error, "Example.com/app", False), (qualified_name_error, "a" * 64, False),
        (qualified_name_error, "/app", False), (qualified_name_error, "app_x.y-z", True),
        (label_value_error, "", True), (label_value_error, "a.b_c-d", True), (label_value_error, "-a", False),
        (port_name_error, "http", True), (port_name_error, "web-8080", True), (port_name_error, "8080", False),
        (port_name_error, "a--b", False), (port_name_error, "a" * 16, False),
        (env_name_error, "PATH", True), (env_name_error, "my.var-1", True), (env_name_error, "1ST", True),
        (env_name_error, "A=B", False), (env_name_error, "tab\there", False),
    ],
)
def test_name_formats(check, value, ok):
    assert (check(value) is None) is ok


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("100m", NANO // 10), ("1.5", 3 * NANO // 2), ("1", NANO), (2, 2 * NANO), (0.5, NANO // 2),
        ("64Mi", 64 * 2**20 * NANO), ("1G", 10**9 * NANO), ("1e3", 1000 * NANO), ("1E3", 1000 * NANO),
        ("1.5Gi", 3 * 2**29 * NANO), ("500u", 500_000), ("10n", 10), ("2k", 2000 * NANO), ("1E", 10**18 * NANO),
        ("+5", 5 * NANO), ("-5m", -5_000_000), (".5", NANO // 2), ("5.", 5 * NANO), ("1e-3", 10**6), ("0", 0),
        # Finer than a nano-unit rounds up, away from zero, as the API server's Quantity does.
        ("1e-12", 1), ("-1e-12", -1), ("1.0000000001", NANO + 1), ("0.5n", 1), ("1.5Ki", 1536 * NANO),
    ],
)
def test_parse_quantity_in_nano_units(text, nanos):
    assert parse_quantity(text) == nanos


_MANTISSAS = st.one_of(st.from_regex(r"[+-]?[0-9]{1,12}", fullmatch=True),
                       st.from_regex(r"[+-]?[0-9]{0,9}\.[0-9]{1,14}", fullmatch=True),
                       st.from_regex(r"[+-]?[0-9]{1,9}\.", fullmatch=True))
_SUFFIXES = st.one_of(st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
                                       "Ei"]),
                      st.builds(lambda e, sign: f"e{sign}{e}", st.integers(0, 30), st.sampled_from(["", "+", "-"])))


@given(_MANTISSAS, _SUFFIXES)
def test_parse_quantity_agrees_with_exact_decimals(mantissa, suffix):
    """Integer arithmetic in the agent, checked against decimal.Decimal at ample precision (which the agent no longer
    loads): the value in nano-units, rounded away from zero, or out of range beyond an int64 of units."""
    from decimal import ROUND_UP, Decimal, localcontext
    with localcontext() as context:
        context.prec = 200
        multiplier = (Decimal(2) ** (10 * ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].index(suffix) + 10)
                      if suffix.endswith("i") else Decimal(10) ** {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6,
                                                                "G": 9, "T": 12, "P": 15, "E": 18}[suffix]
                      if not suffix.startswith("e") else Decimal(10) ** int(suffix[1:]))
        exact = Decimal(mantissa) * multiplier
        if abs(exact) >= 2**63:
            with pytest.raises(ValueError, match="out of range"):
                parse_quantity(mantissa + suffix)
        else:
            expected = int((exact * 10**9).quantize(Decimal(1), rounding=ROUND_UP))
            assert parse_quantity(mantissa + suffix) == expected


@pytest.mark.parametrize("text", ["", "1K", "1 Mi", "Mi", "1.2.3", "1e", "1Mi2", "0x10", "1e999", "1Ei" * 2, True,
                                  None, [1], "9999999999Ei", float("nan")])
def test_parse_quantity_rejects(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "whole", "millis"),
    [("100m", 1, 100), ("1.5", 2, 1500), ("0.0001", 1, 1), ("64Mi", 64 * 2**20, 64 * 2**20 * 1000), ("0", 0, 0)],
)
def test_quantity_rounding_is_upwards(text, whole, millis):
    assert to_int_ceil(parse_quantity(text)) == whole
    assert to_millis_ceil(parse_quantity(text)) == millis


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (10 * 2**20, "10Mi"), (10**8, "100M"), (1536, "1536"),
                                               (2**30, "1Gi"), (3000, "3k")])
def test_format_bytes(count, text):
    assert format_bytes(count) == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8)
    | st.sampled_from(["", "100m", "Always", "TCP", "/", "app", "exec", "1Gi"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from([
        "name", "image", "containers", "initContainers", "ports", "containerPort", "hostPort", "protocol", "env",
        "value", "valueFrom", "fieldRef", "fieldPath", "volumes", "volumeMounts", "mountPath", "emptyDir", "hostPath",
        "path", "resources", "limits", "requests", "cpu", "memory", "livenessProbe", "httpGet", "exec", "command",
        "port", "spec", "metadata", "labels", "annotations", "restartPolicy", "dnsConfig", "nameservers",
        "lifecycle", "preStop", "securityContext", "runAsUser", "items", "configMap", "secret", "envFrom",
        "configMapRef", "hostNetwork", "imagePullSecrets",
    ]), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["metadata", "spec", "status"]), json_values))
def test_arbitrary_input_never_crashes(pod):
    pod = copy.deepcopy(pod)
    apply_defaults(pod)
    problems = validate_pod(pod)
    assert all(isinstance(path, str) and isinstance(message, str) for path, message in problems)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_spec_never_crashes(spec):
    pod = {"metadata": {"name": "x"}, "spec": spec}
    apply_defaults(pod)
    validate_pod(pod)
