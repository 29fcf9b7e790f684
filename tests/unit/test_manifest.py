"""Manifests: YAML/JSON documents into defaulted static pods, ConfigMaps and Secrets; errors name file and field."""

from __future__ import annotations

import base64
import json

import pytest

from edgelet.api import podutil
from edgelet.podconfig.defaults import apply_defaults, default_pull_policy, make_static, static_pod_uid
from edgelet.podconfig.manifest import load_manifest_file, parse_manifest
from edgelet.util.errors import ConfigError

PATH = "/etc/edgelet/manifests/web.yaml"

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: app
    image: busybox:1.36
    command: [sleep, "3600"]
"""


def parse(text: str, node: str = "node1", **kwargs):
    return parse_manifest(text.encode(), PATH, node, seen="2024-01-01T00:00:00.000000Z", **kwargs)


def test_single_pod_becomes_a_static_pod():
    (pod,) = parse(POD_YAML).pods
    meta = pod["metadata"]
    assert meta["name"] == "web-node1"
    assert meta["namespace"] == "default"
    assert len(meta["uid"]) == 32
    assert meta["annotations"] == {
        podutil.CONFIG_HASH_ANNOTATION: meta["uid"],
        podutil.CONFIG_SOURCE_ANNOTATION: "file",
        podutil.CONFIG_SEEN_ANNOTATION: "2024-01-01T00:00:00.000000Z",
    }
    assert pod["spec"]["nodeName"] == "node1"
    assert {"operator": "Exists", "effect": "NoExecute"} in pod["spec"]["tolerations"]
    assert pod["status"] == {"phase": "Pending"}
    assert podutil.is_static(pod) and podutil.full_name(pod) == "web-node1_default"


def test_static_uid_is_pinned():
    """Golden value: a change here gives every static pod a new uid, restarting them all on upgrade."""
    (pod,) = parse(POD_YAML).pods
    assert pod["metadata"]["uid"] == "db5e5c7f3b35486a3d0955570ed2a691"


def test_static_uid_depends_on_content_node_and_source():
    uid = parse(POD_YAML).pods[0]["metadata"]["uid"]
    assert parse(POD_YAML).pods[0]["metadata"]["uid"] == uid  # deterministic
    assert parse(POD_YAML, node="node2").pods[0]["metadata"]["uid"] != uid
    assert parse(POD_YAML.replace("3600", "3601")).pods[0]["metadata"]["uid"] != uid
    moved = parse_manifest(POD_YAML.encode(), "/other/web.yaml", "node1").pods[0]["metadata"]["uid"]
    assert moved != uid
    http = parse(POD_YAML, source="http", location="http://127.0.0.1/pods")
    assert http.pods[0]["metadata"]["uid"] not in (uid, moved)
    assert http.pods[0]["metadata"]["annotations"][podutil.CONFIG_SOURCE_ANNOTATION] == "http"
    assert "tolerations" not in http.pods[0]["spec"]  # the NoExecute toleration is for file pods only


def test_http_uid_ignores_the_node():
    pod = {"metadata": {"name": "a"}, "spec": {}}
    assert (static_pod_uid(pod, "n1", "http://x", "http") == static_pod_uid(pod, "n2", "http://x", "http"))


def test_explicit_uid_and_namespace_are_kept():
    text = POD_YAML.replace("  name: web\n", "  name: web\n  namespace: edge\n  uid: 1234-abcd\n")
    (pod,) = parse(text).pods
    assert (pod["metadata"]["uid"], pod["metadata"]["namespace"]) == ("1234-abcd", "edge")
    assert pod["metadata"]["annotations"][podutil.CONFIG_HASH_ANNOTATION] == "1234-abcd"


def test_node_name_is_lower_cased_in_the_pod_name():
    (pod,) = parse(POD_YAML, node="Edge1").pods
    assert pod["metadata"]["name"] == "web-edge1"


def test_defaults_are_applied():
    (pod,) = parse(POD_YAML).pods
    spec = pod["spec"]
    assert (spec["restartPolicy"], spec["terminationGracePeriodSeconds"]) == ("Always", 30)
    assert (spec["dnsPolicy"], spec["schedulerName"]) == ("ClusterFirst", "default-scheduler")
    assert (spec["enableServiceLinks"], spec["securityContext"]) == (True, {})
    container = spec["containers"][0]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "File"


def test_defaults_of_nested_fields():
    pod = apply_defaults({"spec": {
        "hostNetwork": True,
        "containers": [{
            "name": "a", "image": "x",
            "ports": [{"containerPort": 53, "protocol": "UDP"}, {"containerPort": 80}],
            "readinessProbe": {"httpGet": {"port": 80}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80, "path": "/quit"}}},
            "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Mi"}},
            "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        }],
        "volumes": [{"name": "scratch"}, {"name": "s", "secret": {"secretName": "s"}}],
    }})
    container = pod["spec"]["containers"][0]
    assert container["ports"] == [{"containerPort": 53, "protocol": "UDP", "hostPort": 53},
                                  {"containerPort": 80, "protocol": "TCP", "hostPort": 80}]
    assert container["readinessProbe"] == {"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "periodSeconds": 10,
                                           "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
    assert container["lifecycle"]["preStop"]["httpGet"] == {"port": 80, "path": "/quit", "scheme": "HTTP"}
    assert container["resources"]["requests"] == {"memory": "1Mi", "cpu": "1"}
    assert container["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert pod["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}},
                                      {"name": "s", "secret": {"secretName": "s", "defaultMode": 0o644}}]


@pytest.mark.parametrize(
    ("image", "policy"),
    [("busybox", "Always"), ("busybox:latest", "Always"), ("busybox:1.36", "IfNotPresent"),
     ("127.0.0.1:5000/busybox", "Always"), ("127.0.0.1:5000/busybox:v1", "IfNotPresent"),
     ("registry:5000/team/app:latest", "Always"), ("busybox@sha256:" + "a" * 64, "IfNotPresent")],
)
def test_default_pull_policy(image, policy):
    assert default_pull_policy(image) == policy


def test_explicit_values_are_not_overridden():
    text = POD_YAML + "    imagePullPolicy: Never\n  restartPolicy: OnFailure\n"
    (pod,) = parse(text).pods
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Never"


def test_make_static_keeps_an_existing_toleration():
    pod = {"metadata": {"name": "a"}, "spec": {"tolerations": [{"operator": "Exists"}]}}
    make_static(pod, "n", "/m/a.yaml")
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_multi_document_yaml_with_configmap_and_secret():
    text = POD_YAML + """\
---
# an empty document is skipped
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data: {config.yaml: "port: 80"}
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret, namespace: edge}
data: {token: c2VjcmV0}
stringData: {password: hunter2}
"""
    objects = parse(text)
    assert [p["metadata"]["name"] for p in objects.pods] == ["web-node1"]
    (configmap,) = objects.configmaps
    assert configmap["metadata"] == {"name": "web-config", "namespace": "default"}
    (secret,) = objects.secrets
    assert secret["type"] == "Opaque" and "stringData" not in secret
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {"token": b"secret", "password": b"hunter2"}


def test_pod_list_and_list():
    pods = {"kind": "PodList", "items": [json.loads(json.dumps(_pod("a"))), _pod("b")]}
    assert [p["metadata"]["name"] for p in parse(json.dumps(pods)).pods] == ["a-node1", "b-node1"]
    mixed = {"apiVersion": "v1", "kind": "List",
             "items": [_pod("a"), {"kind": "ConfigMap", "metadata": {"name": "c"}}]}
    objects = parse(json.dumps(mixed))
    assert len(objects.pods) == 1 and len(objects.configmaps) == 1


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}


def test_json_manifest():
    (pod,) = parse(json.dumps(_pod("j"))).pods
    assert pod["metadata"]["name"] == "j-node1"


def test_empty_file_has_no_objects():
    objects = parse("")
    assert (objects.pods, objects.configmaps, objects.secrets) == ((), (), ())
    assert parse("---\n---\n# nothing\n").pods == ()


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("kind: Deployment\nmetadata: {name: x}\n", "kind", "unsupported kind 'Deployment'"),
        ("metadata: {name: x}\n", "kind", "unsupported kind None"),
        ("apiVersion: apps/v1\nkind: Pod\n", "apiVersion", "must be apiVersion v1"),
        (POD_YAML.replace("image: busybox:1.36", "image: ''"), "spec.containers[0].image", "is required"),
        (POD_YAML.replace("name: app", "name: App"), "spec.containers[0].name", "DNS-1123 label"),
        ("kind: PodList\nitems: 3\n", "items", "list of items"),
        (POD_YAML + "---\n" + POD_YAML.replace("busybox:1.36", "''"), "document 2: spec.containers[0].image",
         "required"),
        (json.dumps({"kind": "List", "items": [_pod("ok"), {**_pod("x"), "kind": "Service"}]}), "items[1].kind",
         "unsupported kind 'Service'"),
        (json.dumps({"kind": "PodList", "items": [{"kind": "ConfigMap", "metadata": {"name": "c"}}]}), "items[0].kind",
         "expected Pod"),
        ("- a\n- b\n", "", "expected an object with a kind"),
        ("kind: Pod\nmetadata:\n  name: x\n  labels: {1: a}\n", "metadata.labels", "key 1 must be a string"),
        ("kind: ConfigMap\nmetadata: {name: c}\ndata: {a: 1}\n", "data['a']", "must be a string"),
        ("kind: ConfigMap\nmetadata: {name: c}\ndata: {'a/b': x}\n", "data['a/b']", "not a valid key"),
        ("kind: Secret\nmetadata: {name: s}\ndata: {a: '!!!'}\n", "data['a']", "not valid base64"),
        ("kind: ConfigMap\nmetadata: {name: C}\n", "metadata.name", "DNS-1123 subdomain"),
    ],
)
def test_errors_name_the_field(text, key, fragment):
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert caught.value.path == PATH
    assert caught.value.key == key
    assert fragment in caught.value.message
    assert "\n" not in str(caught.value)


def test_every_problem_is_listed_on_one_line():
    text = POD_YAML.replace("image: busybox:1.36", "image: ''\n    imagePullPolicy: Sometimes")
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert caught.value.key == "spec.containers[0].image"
    assert "more problem" not in str(caught.value) and "\n" not in str(caught.value)
    assert "; spec.containers[0].imagePullPolicy: must be one of Always, IfNotPresent, Never" in caught.value.message


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (POD_YAML.replace("command:", "comand:"), "spec.containers[0].comand",
         'unknown field "comand" (did you mean "command"?)'),
        (POD_YAML.replace("labels:", "lables:"), "metadata.lables", 'unknown field "lables" (did you mean "labels"?)'),
        (POD_YAML + "  volumes: [{name: v, hostpath: {path: /x}}]\n", "spec.volumes[0].hostpath",
         'unknown field "hostpath" (did you mean "hostPath"?)'),
        (POD_YAML.replace("  - name: app", "  - name: app\n    livenessProbe: {exec: {command: [x]}, periodSecond: 5}"),
         "spec.containers[0].livenessProbe.periodSecond", '(did you mean "periodSeconds"?)'),
        (POD_YAML + "  flavour: vanilla\n", "spec.flavour", 'unknown field "flavour"'),
        (POD_YAML + "extra: 1\n", "extra", 'unknown field "extra"'),
        ("kind: ConfigMap\nmetadata: {name: c}\ndatta: {a: b}\n", "datta", '(did you mean "data"?)'),
        (json.dumps({"kind": "List", "itemz": []}), "itemz", '(did you mean "items"?)'),
        (POD_YAML + "---\n" + POD_YAML.replace("image:", "imag:"), "document 2: spec.containers[0].imag",
         '(did you mean "image"?)'),
    ],
)
def test_unknown_fields_are_errors_with_the_path_as_written(text, key, message):
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert caught.value.key == key
    assert message in caught.value.message


def test_known_fields_edgelet_does_not_act_on_stay_accepted():
    text = POD_YAML + "  affinity: {nodeAffinity: {anything: [1]}}\n  priorityClassName: high\n"
    (pod,) = parse(text.replace("  - name: app", "  - name: app\n    stdin: true\n    tty: true")).pods
    assert pod["spec"]["priorityClassName"] == "high"


def test_an_error_names_the_field_the_user_wrote_not_the_defaulted_copy():
    text = POD_YAML.replace("  - name: app", "  - name: app\n    resources: {limits: {cpu: two}}")
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert caught.value.key == "spec.containers[0].resources.limits.cpu"
    assert "requests" not in str(caught.value)


def test_the_api_pod_source_does_not_reject_unknown_fields():
    from edgelet.podconfig.validation import validate_pod

    (pod,) = parse(POD_YAML).pods
    pod["spec"]["fieldOfANewerServer"] = {"x": 1}
    pod["spec"]["containers"][0]["futureKnob"] = True
    assert validate_pod(pod) == []


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("kind: Pod\nmetadata: {name: [}\n", "invalid YAML at line 2"),
     ('{"kind": "Pod",\n  "spec": [}', "invalid JSON at line 2, column 12"),
     ("kind: Pod\n\tname: x\n", "invalid YAML at line 2")],
)
def test_syntax_errors_name_the_line(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse(text)


def test_yaml_flow_style_is_not_mistaken_for_json():
    (pod,) = parse("{kind: Pod, metadata: {name: flow}, spec: {containers: [{name: c, image: 'busybox:1'}]}}").pods
    assert pod["metadata"]["name"] == "flow-node1"


def test_oversized_manifest_is_refused():
    with pytest.raises(ConfigError, match="more than the"):
        parse(POD_YAML + "#" * (8 * 1024 * 1024))


def test_binary_garbage():
    with pytest.raises(ConfigError, match="not UTF-8"):
        parse_manifest(b"\xff\xfe\x00kind", PATH, "n")


def test_load_manifest_file(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text(POD_YAML)
    (pod,) = load_manifest_file(str(path), "node1").pods
    assert pod["metadata"]["name"] == "web-node1"
    with pytest.raises(ConfigError, match=f"{tmp_path}/missing.yaml: cannot read manifest"):
        load_manifest_file(str(tmp_path / "missing.yaml"), "node1")


def test_yaml_timestamps_become_strings():
    text = POD_YAML.replace("  name: web\n", "  name: web\n  creationTimestamp: 2024-05-01T10:00:00Z\n")
    (pod,) = parse(text).pods
    assert pod["metadata"]["creationTimestamp"] == "2024-05-01T10:00:00Z"
    json.dumps(pod)  # the pod stays plain JSON
