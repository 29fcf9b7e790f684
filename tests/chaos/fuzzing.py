"""Hostile input for the fuzz experiment: Hypothesis strategies from the Pod schema, mutations of valid objects,
bombs, and the agent's own entry points run on each case with a verdict (ok, clear error, or failure).

A case fails when the agent's code raises anything but its documented error, takes longer than CASE_SECONDS, or
gives an error that does not name the input (file or object) or, for a well-formed document, the field.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from hypothesis import strategies as st

from edgelet.api import podutil
from edgelet.api.qos import qos_class
from edgelet.api.resources import linux_resources
from edgelet.container.runtime import PodRuntimeStatus
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kuberuntime.actions import compute_pod_actions
from edgelet.kuberuntime.container import make_container_config
from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.lifecycle.admission import admit, rejected_status
from edgelet.status.generate import generate_pod_status
from edgelet.util.errors import ConfigError

CASE_SECONDS = 5
# An error that echoes a 1 MB field value whole floods the log of a small device.
MAX_ERROR_CHARS = 2000
HUGE = 1_000_000

# -- values ---------------------------------------------------------------------------------------------------

INT_EDGES = (0, -1, 1, 2**31 - 1, 2**31, -2**31 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**70, -2**70)
WILD = st.one_of(
    st.none(), st.booleans(), st.sampled_from(INT_EDGES), st.integers(-2**80, 2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "../../etc/passwd", "a" * 300, "ünï©ødé", "${HOME}", "$(X)", "1e400",
                     "-0", "0x10", "NaN"]),
    st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just("A" * HUGE),
)
NAME = st.one_of(st.sampled_from(["main", "web", "a", "side-car", "x1"]),
                 st.from_regex(r"[a-z][a-z0-9-]{0,14}", fullmatch=True))
QUANTITY = st.one_of(st.sampled_from(["100m", "1", "1Gi", "0.5", "64Mi", "1e3", "-1", "0", "1e400", "9" * 40 + "Ei",
                                      "abc", "", "1.5.5", "2Ki", "100u"]), st.integers(-2**70, 2**70))


def int32():
    return st.one_of(st.integers(0, 100), st.sampled_from(INT_EDGES), st.integers(-2**31, 2**31 - 1))


def int64():
    return st.one_of(st.integers(0, 3600), st.sampled_from(INT_EDGES), st.integers(-2**63, 2**63 - 1))


def wild_or(strategy, wild_share: int = 8):
    """Mostly the typed value, about one time in `wild_share` anything at all (type confusion)."""
    return st.one_of(*([strategy] * (wild_share - 1)), WILD)


def obj(required: dict | None = None, optional: dict | None = None):
    return wild_or(st.fixed_dictionaries({k: v for k, v in (required or {}).items()},
                                         optional={k: v for k, v in (optional or {}).items()}))


def listof(strategy, max_size: int = 3, min_size: int = 0):
    return wild_or(st.lists(strategy, min_size=min_size, max_size=max_size))


def strmap():
    return wild_or(st.dictionaries(st.one_of(st.from_regex(r"[a-z0-9./-]{1,20}", fullmatch=True), st.text(max_size=8)),
                                   st.one_of(st.text(max_size=20), WILD), max_size=3))


def enum(*values):
    return wild_or(st.sampled_from(values))


# -- the Pod schema (the fields edgelet reads, with their API types) --------------------------------------------

def _handler():
    return obj(optional={
        "exec": obj({"command": listof(st.text(max_size=10), min_size=1)}),
        "httpGet": obj({"port": st.one_of(int32(), NAME)},
                       {"path": st.text(max_size=20), "host": st.text(max_size=10),
                        "scheme": enum("HTTP", "HTTPS", "FTP"),
                        "httpHeaders": listof(obj({"name": st.text(max_size=8), "value": st.text(max_size=8)}))}),
        "tcpSocket": obj({"port": st.one_of(int32(), NAME)}),
        "grpc": obj({"port": int32()}, {"service": st.text(max_size=8)}),
        "sleep": obj({"seconds": int64()}),
    })


def _probe():
    numbers = {key: int32() for key in ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold",
                                       "successThreshold")}
    return obj(optional={**numbers, "terminationGracePeriodSeconds": int64(),
                         "exec": obj({"command": listof(st.text(max_size=8))}),
                         "httpGet": obj({"port": st.one_of(int32(), NAME)}, {"path": st.text(max_size=20)}),
                         "tcpSocket": obj({"port": st.one_of(int32(), NAME)}), "grpc": obj({"port": int32()})})


def _env_var():
    ref = obj({"name": NAME, "key": st.text(max_size=10)}, {"optional": st.booleans()})
    return obj({"name": st.one_of(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=8))},
               {"value": st.text(max_size=20),
                "valueFrom": obj(optional={"fieldRef": obj({"fieldPath": st.sampled_from(
                    ["metadata.name", "metadata.labels['a']", "status.podIP", "spec.nodeName", "bogus",
                     "metadata.annotations['x']"])}),
                    "configMapKeyRef": ref, "secretKeyRef": ref,
                    "resourceFieldRef": obj({"resource": st.sampled_from(["limits.cpu", "requests.memory", "x"])},
                                            {"divisor": QUANTITY, "containerName": NAME})})})


def _container():
    resources = obj(optional={section: wild_or(st.dictionaries(st.sampled_from(["cpu", "memory", "ephemeral-storage",
                                                                                "x"]),
                                                              QUANTITY, max_size=3))
                              for section in ("limits", "requests")})
    return obj({"name": NAME, "image": st.one_of(st.just("docker.io/library/busybox:local"), st.text(max_size=30))}, {
        "imagePullPolicy": enum("Always", "Never", "IfNotPresent", "Sometimes"),
        "command": listof(st.text(max_size=20)), "args": listof(st.text(max_size=20)),
        "workingDir": st.text(max_size=20), "env": listof(_env_var()),
        "envFrom": listof(obj(optional={"prefix": st.text(max_size=5), "configMapRef": obj({"name": NAME}),
                                        "secretRef": obj({"name": NAME})})),
        "ports": listof(obj({"containerPort": int32()},
                            {"hostPort": int32(), "protocol": enum("TCP", "UDP", "SCTP", "ICMP"),
                                                         "name": NAME, "hostIP": st.text(max_size=15)})),
        "resources": resources,
        "volumeMounts": listof(obj({"name": NAME, "mountPath": st.text(max_size=20)},
                                   {"subPath": st.text(max_size=10), "readOnly": st.booleans(),
                                    "mountPropagation": enum("None", "HostToContainer", "Bidirectional")})),
        "livenessProbe": _probe(), "readinessProbe": _probe(), "startupProbe": _probe(),
        "lifecycle": obj(optional={"postStart": _handler(), "preStop": _handler()}),
        "securityContext": obj(optional={"privileged": st.booleans(), "runAsUser": int64(), "runAsGroup": int64(),
                                         "runAsNonRoot": st.booleans(), "readOnlyRootFilesystem": st.booleans(),
                                         "allowPrivilegeEscalation": st.booleans(),
                                         "capabilities": obj(optional={"add": listof(st.text(max_size=10)),
                                                                       "drop": listof(st.text(max_size=10))})}),
        "restartPolicy": enum("Always", "Never"),
        "stdin": st.booleans(), "tty": st.booleans(), "terminationMessagePath": st.text(max_size=20),
        "terminationMessagePolicy": enum("File", "FallbackToLogsOnError", "Other"),
    })


def _volume():
    items = listof(obj({"key": st.text(max_size=8), "path": st.text(max_size=12)}, {"mode": int32()}))
    return obj({"name": NAME}, {
        "emptyDir": obj(optional={"medium": enum("", "Memory", "Disk"), "sizeLimit": QUANTITY}),
        "hostPath": obj({"path": st.text(max_size=20)},
                        {"type": enum("", "Directory", "DirectoryOrCreate", "File", "Socket")}),
        "configMap": obj({"name": NAME}, {"items": items, "defaultMode": int32(), "optional": st.booleans()}),
        "secret": obj({"secretName": NAME}, {"items": items, "defaultMode": int32()}),
        "downwardAPI": obj(optional={"items": listof(obj({"path": st.text(max_size=10)},
                                                         {"fieldRef": obj({"fieldPath": st.text(max_size=20)})}))}),
        "projected": obj(optional={"sources": listof(obj(optional={"configMap": obj({"name": NAME}),
                                                                   "secret": obj({"name": NAME})})),
                                   "defaultMode": int32()}),
        "nfs": obj({"server": st.text(max_size=10), "path": st.text(max_size=10)}),
    })


def pod_dicts():
    """Pods as a manifest or the API may hold them: mostly well-typed, with wild values anywhere."""
    metadata = obj({"name": st.one_of(NAME, st.text(max_size=70))},
                   {"namespace": st.one_of(NAME, st.text(max_size=10)), "labels": strmap(), "annotations": strmap(),
                    "uid": st.one_of(st.uuids().map(str), st.text(max_size=10)), "generateName": st.text(max_size=5)})
    spec = obj({"containers": listof(_container(), max_size=3, min_size=1)}, {
        "initContainers": listof(_container(), max_size=2),
        "restartPolicy": enum("Always", "OnFailure", "Never", "Sometimes"),
        "terminationGracePeriodSeconds": int64(), "activeDeadlineSeconds": int64(),
        "hostNetwork": st.booleans(), "hostPID": st.booleans(), "hostIPC": st.booleans(),
        "shareProcessNamespace": st.booleans(),
        "dnsPolicy": enum("ClusterFirst", "Default", "None", "ClusterFirstWithHostNet"),
        "nodeSelector": strmap(), "volumes": listof(_volume(), max_size=3), "priority": int32(),
        "hostname": st.text(max_size=20), "subdomain": st.text(max_size=10),
        "hostAliases": listof(obj({"ip": st.text(max_size=15)}, {"hostnames": listof(st.text(max_size=10))})),
        "dnsConfig": obj(optional={"nameservers": listof(st.text(max_size=15)),
                                   "searches": listof(st.text(max_size=15)),
                                   "options": listof(obj({"name": st.text(max_size=8)},
                                                         {"value": st.text(max_size=8)}))}),
        "securityContext": obj(optional={"runAsUser": int64(), "runAsGroup": int64(), "fsGroup": int64(),
                                         "supplementalGroups": listof(int64()),
                                         "sysctls": listof(obj({"name": st.text(max_size=15),
                                                                "value": st.text(max_size=5)}))}),
        "tolerations": listof(obj(optional={"key": st.text(max_size=5), "operator": enum("Exists", "Equal"),
                                            "effect": enum("NoSchedule", "NoExecute"), "tolerationSeconds": int64()})),
        "enableServiceLinks": st.booleans(), "nodeName": st.text(max_size=10),
    })
    return st.fixed_dictionaries({"apiVersion": enum("v1", "v2"),
                                  "kind": enum("Pod", "Pod", "Pod", "ConfigMap", "Deployment"),
                                  "metadata": metadata, "spec": spec})


def configmap_dicts():
    data = wild_or(st.dictionaries(st.text(max_size=12), st.one_of(st.text(max_size=20), WILD), max_size=4))
    return st.fixed_dictionaries(
        {"apiVersion": enum("v1"), "kind": st.sampled_from(["ConfigMap", "Secret"]),
         "metadata": obj({"name": st.one_of(NAME, st.text(max_size=10))},
                         {"namespace": st.one_of(NAME, st.text(max_size=5))})},
        optional={"data": data, "binaryData": data, "stringData": data, "type": WILD, "immutable": WILD})


# -- mutation of valid objects --------------------------------------------------------------------------------

def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def mutate(value: Any, draw: Callable, rounds: int) -> Any:
    """Replace, delete, retype or duplicate random parts of a (deep-copied) valid object."""
    value = json.loads(json.dumps(value))
    for _ in range(rounds):
        paths = [p for p in _paths(value) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "wrap", "duplicate", "extra-key"]))
        if action == "replace":
            parent[last] = draw(WILD)
        elif action == "delete":
            del parent[last]
        elif action == "wrap":
            parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(json.loads(json.dumps(parent[last])))
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(WILD)
    return value


def serialize(value: Any, how: str) -> bytes:
    if how == "json":
        return json.dumps(value).encode()
    return yaml.safe_dump(value, allow_unicode=True, width=10_000).encode()


def garble(data: bytes, draw: Callable) -> bytes:
    """Byte-level damage: flip, insert or cut at random offsets."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "cut"]))
        if action == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[at:at] = draw(st.sampled_from([b"&a ", b"*a", b"\x00", b"{", b"[", b"- ", b":", b"\n  ", b"!!binary ",
                                                b"<<: "]))
        else:
            del data[at:at + draw(st.integers(1, 20))]
    return bytes(data)


# -- bombs and oddities: fixed cases every run ----------------------------------------------------------------

def _alias_bomb(levels: int, width: int) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return ("\n".join(lines) + "\nkind: Pod\n").encode()


def bombs(valid_pod: dict) -> list[tuple[str, bytes]]:
    deep = 10_000
    pod_json = json.dumps(valid_pod)
    return [
        ("alias bomb 9x9", _alias_bomb(9, 9)),
        ("alias bomb 20x4", _alias_bomb(20, 4)),
        ("alias into a pod field", b"x: &a [1]\napiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: *a}\n"
                                   b"spec: {containers: [{name: c, image: i}]}\n"),
        ("recursive alias", b"kind: Pod\nmetadata: &m {name: a, self: *m}\n"),
        ("merge key", b"base: &b {name: c, image: i}\nkind: Pod\napiVersion: v1\nmetadata: {name: a}\n"
                      b"spec: {containers: [{<<: *b}]}\n"),
        ("deep JSON list", b"[" * deep + b"]" * deep),
        ("deep JSON object", b'{"a":' * deep + b"1" + b"}" * deep),
        ("deep YAML flow", b"kind: Pod\nmetadata: " + b"[" * deep + b"]" * deep + b"\n"),
        ("deep YAML block",
         ("kind: Pod\nmetadata:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(2000))).encode()),
        ("deep field in a pod",
         pod_json.replace('"labels": {', '"labels": {"x": ' + "[" * deep + "]" * deep + ", ", 1).encode()
         if '"labels": {' in pod_json else pod_json.encode()),
        ("one MB name", json.dumps({**valid_pod, "metadata": {"name": "n" * HUGE}}).encode()),
        ("one MB image",
         json.dumps({**valid_pod, "spec": {"containers": [{"name": "c", "image": "i" * HUGE}]}}).encode()),
        ("just over the size limit", b"# " + b"x" * (8 * 1024 * 1024) + b"\n"),
        ("ten thousand documents", b"---\n".join([b"kind: Pod\nmetadata: {name: a}"] * 10_000)),
        ("100k labels",
         json.dumps({**valid_pod,
                     "metadata": {"name": "a", "labels": {f"k{i}": "v" for i in range(100_000)}}}).encode()),
        ("2^70 deadline",
         json.dumps({**valid_pod, "spec": {**valid_pod["spec"], "activeDeadlineSeconds": 2**70}}).encode()),
        ("2^70 grace",
         json.dumps({**valid_pod, "spec": {**valid_pod["spec"], "terminationGracePeriodSeconds": 2**70}}).encode()),
        ("2^64 runAsUser",
         json.dumps({**valid_pod, "spec": {**valid_pod["spec"], "securityContext": {"runAsUser": 2**64}}}).encode()),
        ("NaN in JSON", pod_json.replace('"restartPolicy": "Always"', '"restartPolicy": NaN').encode()),
        ("YAML .inf grace",
         b"apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  terminationGracePeriodSeconds: .inf\n"
                            b"  containers: [{name: c, image: i}]\n"),
        ("python tag", b"!!python/object/apply:os.system [echo hi]\n"),
        ("set tag", b"kind: Pod\nmetadata: !!set {a, b}\n"),
        ("binary name",
         b"kind: Pod\napiVersion: v1\nmetadata: {name: !!binary aGVsbG8=}\n"
         b"spec: {containers: [{name: c, image: i}]}\n"),
        ("timestamp name",
         b"kind: Pod\napiVersion: v1\nmetadata: {name: 2001-12-14}\nspec: {containers: [{name: c, image: i}]}\n"),
        ("complex key", b"? [a, b]\n: 1\nkind: Pod\n"),
        ("int key", b"1: 2\nkind: Pod\n"),
        ("empty", b""),
        ("only comments", b"# nothing\n"),
        ("null", b"null\n"),
        ("a list", b"[1, 2]\n"),
        ("NUL bytes", b"kind: Pod\x00\x00\n"),
        ("invalid UTF-8", b"kind: \xff\xfePod\n"),
        ("UTF-16", "kind: Pod\n".encode("utf-16")),
        ("BOM then JSON", b"\xef\xbb\xbf" + pod_json.encode()),
        ("control characters", b"kind: Pod\nmetadata: {name: \"a\\x07b\"}\n"),
    ]


# -- running a case -----------------------------------------------------------------------------------------

class CaseTimeout(BaseException):
    """Raised by the alarm in a case that runs too long (a BaseException so no `except Exception` eats it)."""


@dataclass
class Outcome:
    label: str
    failure: str = ""


def _alarm(signum, frame):
    raise CaseTimeout()


def run_case(label: str, call: Callable[[], Any], *, names: str, field_expected: bool,
             tolerated: tuple[type[BaseException], ...] = ()) -> Outcome:
    """Runs `call`; a ConfigError must name `names` and (if expected) a field; `tolerated` errors are reported
    by the agent in a pod's status, so they count as handled."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    # Repeats every second: an alarm that lands in a garbage-collector callback is swallowed there.
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS, 1.0)
    try:
        call()
        return Outcome(label)
    except CaseTimeout:
        return Outcome(label, f"ran longer than {CASE_SECONDS} s")
    except ConfigError as err:
        text = str(err)
        if names not in text:
            return Outcome(label, f"error does not name {names!r}: {text[:200]}")
        if field_expected and not err.key:
            return Outcome(label, f"error names no field: {text[:200]}")
        if len(text) > MAX_ERROR_CHARS:
            return Outcome(label, f"error is {len(text)} characters long: {text[:120]}...")
        return Outcome(label)
    except tolerated:
        return Outcome(label)
    except RecursionError:
        return Outcome(label, "RecursionError")
    except MemoryError:
        return Outcome(label, "MemoryError")
    except Exception as err:  # noqa: BLE001  (any other exception is the finding)
        return Outcome(label, f"{type(err).__name__}: {str(err)[:200]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exercise_pod(pod: dict) -> None:
    """What the agent does with a pod that passed its source: admission, the status it writes, the runtime
    configs it builds. A pod that is admitted must get through all of it; a rejected one must get a status."""
    verdict = admit(pod, active_pods=0, max_pods=110)
    uid = podutil.uid(pod) or "uid"
    if not verdict.admit:
        orjson.dumps({**pod, "status": rejected_status(verdict)})
        return
    empty = PodRuntimeStatus(uid=uid)
    status = generate_pod_status(pod, empty, old_status=None, now=time.time())
    orjson.dumps({**pod, "status": status})
    compute_pod_actions(pod, empty)
    qos_class(pod)
    make_sandbox_config(pod, 0, logs_root="/var/log/pods")
    for container in podutil.spec(pod).get("containers") or []:
        resources = linux_resources(pod, container, memory_capacity=8 << 30, cgroup_v2=True)
        make_container_config(pod, container, image_ref=str(container.get("image")), restart_count=0,
                              container_hash="0", env=[], command=[], args=[], mounts=[], resources=resources)
        pb.LinuxContainerResources(**resources)
