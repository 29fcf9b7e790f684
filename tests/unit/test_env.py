"""The container environment: $(VAR) expansion, envFrom, valueFrom references and their errors."""

from __future__ import annotations

import asyncio
import base64

import pytest

from edgelet.api.env import (
    EnvError,
    expand,
    expand_command,
    format_map,
    is_env_var_name,
    metadata_field_value,
    resolve_env,
)
from edgelet.api.objectstore import ObjectStore

CONTEXT = {"VAR": "value", "EMPTY": "", "DOLLAR": "$"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("$(VAR)", "value"),
        ("a-$(VAR)-b", "a-value-b"),
        ("$(VAR)$(VAR)", "valuevalue"),
        ("$(EMPTY)x", "x"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),
        ("x$(UNDEFINED)y$(VAR)", "x$(UNDEFINED)yvalue"),
        ("$$(VAR)", "$(VAR)"),
        ("$$$(VAR)", "$value"),
        ("$$$$(VAR)", "$$(VAR)"),
        ("$$", "$"),
        ("$$$", "$$"),
        ("$", "$"),
        ("x$", "x$"),
        ("$(VAR)$", "value$"),
        ("$VAR", "$VAR"),
        ("$ (VAR)", "$ (VAR)"),
        ("$(VAR", "$(VAR"),
        ("$(", "$("),
        ("$()", "$()"),
        ("$(DOLLAR)(VAR)", "$(VAR)"),  # a value is never expanded again
        ("$($(VAR))", "$($(VAR))"),  # the name ends at the first ')': "$(VAR" is unknown
        ("$(VAR)))", "value))"),
        ("é$(VAR)ü", "évalueü"),
    ],
)
def test_expand_follows_kubelet_rules(text, expected):
    assert expand(text, CONTEXT.get) == expected


@pytest.mark.parametrize(
    ("name", "valid"),
    [("MY_VAR", True), ("my.env-name", True), ("1z", True), ("a b", True), ("", False), ("A=B", False),
     ("tab\tname", False), ("ünicode", False)],
)
def test_env_var_names_use_the_relaxed_rule(name, valid):
    assert is_env_var_name(name) is valid


def _pod(env=None, env_from=None, *, resources=None, labels=None, annotations=None, **spec):
    container = {"name": "app", "image": "busybox", "env": env or [], "envFrom": env_from or []}
    if resources is not None:
        container["resources"] = resources
    return {
        "metadata": {"name": "web", "namespace": "prod", "uid": "uid-1", "labels": labels or {},
                     "annotations": annotations or {}},
        "spec": {"containers": [container], "nodeName": "edge-1", "serviceAccountName": "runner", **spec},
    }


def _store():
    store = ObjectStore()
    store.put({"kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "prod"},
               "data": {"LEVEL": "debug", "url": "http://x", "bad=key": "v", "tab\tkey": "v"}})
    store.put({"kind": "Secret", "metadata": {"name": "creds", "namespace": "prod"},
               "data": {"password": base64.b64encode(b"s3cret").decode(),
                        "blob": base64.b64encode(b"\xff\xfe").decode()}})
    return store


def _resolve(pod, **kwargs):
    kwargs.setdefault("store", _store())
    return resolve_env(pod, pod["spec"]["containers"][0], **kwargs)


def test_env_from_then_env_in_order_with_overrides_and_expansion():
    pod = _pod(
        env=[{"name": "A", "value": "$(LEVEL)-a"}, {"name": "B", "value": "$(A)-b"},
             {"name": "C", "value": "$(D)"}, {"name": "D", "value": "d"}, {"name": "LEVEL", "value": "info"}],
        env_from=[{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"},
                  {"configMapRef": {"name": "app-config"}}],
    )
    env = _resolve(pod)
    assert env == [
        ("CFG_LEVEL", "debug"), ("CFG_url", "http://x"), ("LEVEL", "info"), ("url", "http://x"),
        ("A", "debug-a"), ("B", "debug-a-b"), ("C", "$(D)"), ("D", "d"),
    ]


def test_invalid_env_from_keys_are_skipped_with_the_kubelet_event_text():
    warnings: list[str] = []
    env = _resolve(_pod(env_from=[{"configMapRef": {"name": "app-config"}}]), warnings=warnings)
    assert dict(env) == {"LEVEL": "debug", "url": "http://x"}
    assert warnings == ["Keys [bad=key, tab\tkey] from the EnvFrom configMap prod/app-config were skipped since they "
                        "are considered invalid environment variable names."]


def test_service_env_is_expanded_and_appended_unless_overridden():
    pod = _pod(env=[{"name": "URL", "value": "http://$(DB_SERVICE_HOST):$(DB_SERVICE_PORT)"},
                    {"name": "DB_SERVICE_PORT", "value": "6000"}])
    env = _resolve(pod, service_env={"DB_SERVICE_HOST": "10.0.0.5", "DB_SERVICE_PORT": "5432"})
    assert env == [("URL", "http://10.0.0.5:5432"), ("DB_SERVICE_PORT", "6000"), ("DB_SERVICE_HOST", "10.0.0.5")]


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"configMapKeyRef": {"name": "app-config", "key": "LEVEL"}}, "debug"),
        ({"secretKeyRef": {"name": "creds", "key": "password"}}, "s3cret"),
        ({"configMapKeyRef": {"name": "nope", "key": "LEVEL", "optional": True}}, None),
        ({"configMapKeyRef": {"name": "app-config", "key": "nope", "optional": True}}, None),
        ({"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}, None),
        ({"secretKeyRef": {"name": "creds", "key": "nope", "optional": True}}, None),
    ],
)
def test_key_references(ref, expected):
    env = dict(_resolve(_pod(env=[{"name": "X", "valueFrom": ref}])))
    assert env.get("X") == expected


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"configMapKeyRef": {"name": "missing", "key": "k"}}, 'configmap "missing" not found'),
        ({"secretKeyRef": {"name": "missing", "key": "k"}}, 'secret "missing" not found'),
        ({"configMapKeyRef": {"name": "app-config", "key": "k"}}, "couldn't find key k in ConfigMap prod/app-config"),
        ({"secretKeyRef": {"name": "creds", "key": "k"}}, "couldn't find key k in Secret prod/creds"),
        ({"secretKeyRef": {"name": "creds", "key": "blob"}}, "is not UTF-8 text"),
        ({"fieldRef": {"fieldPath": "spec.restartPolicy"}}, "unsupported fieldPath: spec.restartPolicy"),
        ({"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v2"}}, "unsupported pod version: v2"),
        ({"fieldRef": {"fieldPath": "metadata.labels['bad key']"}}, "invalid key subscript"),
        ({"fieldRef": {"fieldPath": "status.hostIP"}}, "the node has no known IP address"),
        ({"resourceFieldRef": {"resource": "limits.gpu"}}, "unsupported container resource : limits.gpu"),
        ({"resourceFieldRef": {"resource": "limits.cpu", "containerName": "ghost"}}, "container ghost not found"),
    ],
)
def test_unresolvable_references_raise_env_error(ref, message):
    with pytest.raises(EnvError) as caught:
        _resolve(_pod(env=[{"name": "X", "valueFrom": ref}]))
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("env_from", "message"),
    [({"configMapRef": {"name": "app"}}, 'configmap "app" not found'),
     ({"secretRef": {"name": "db"}}, 'secret "db" not found')],
)
def test_missing_env_from_source(env_from, message):
    with pytest.raises(EnvError, match=message):
        _resolve(_pod(env_from=[env_from]))
    env_from = {kind: {**ref, "optional": True} for kind, ref in env_from.items()}
    assert _resolve(_pod(env_from=[env_from])) == []


def test_without_a_store_only_optional_references_resolve():
    pod = _pod(env=[{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": True}}}])
    assert _resolve(pod, store=None) == []
    pod["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["optional"] = False
    with pytest.raises(EnvError, match='configmap "c" not found'):
        _resolve(pod, store=None)


@pytest.mark.parametrize(
    ("field_path", "expected"),
    [
        ("metadata.name", "web"),
        ("metadata.namespace", "prod"),
        ("metadata.uid", "uid-1"),
        ("metadata.labels['app']", "web"),
        ("metadata.labels['missing']", ""),
        ("metadata.annotations['example.com/Owner']", "ops"),
        ("spec.nodeName", "edge-1"),
        ("spec.serviceAccountName", "runner"),
        ("status.hostIP", "192.0.2.10"),
        ("status.hostIPs", "192.0.2.10,2001:db8::10"),
        ("status.podIP", "10.88.0.7"),
        ("status.podIPs", "10.88.0.7,fd00::7"),
    ],
)
def test_field_refs(field_path, expected):
    pod = _pod(env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": field_path}}}],
               labels={"app": "web"}, annotations={"example.com/Owner": "ops"})
    env = _resolve(pod, node_ips=["192.0.2.10", "2001:db8::10"], pod_ip="ignored", pod_ips=["10.88.0.7", "fd00::7"])
    assert env == [("X", expected)]


def test_pod_ip_alone_and_node_ip_alone():
    pod = _pod(env=[{"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                    {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}])
    assert _resolve(pod, pod_ip="10.0.0.2", node_ip="192.0.2.1") == [("P", "10.0.0.2"), ("H", "192.0.2.1")]


def test_labels_and_annotations_format_like_the_downward_api():
    assert format_map({"b": 'say "hi"', "a": "x\ny", "c": "tab\there"}) == (
        'a="x\\ny"\nb="say \\"hi\\""\nc="tab\\there"')
    pod = _pod(labels={"z": "1", "a": "é"})
    assert metadata_field_value(pod, "metadata.labels") == 'a="é"\nz="1"'
    assert metadata_field_value(pod, "metadata.annotations") == ""


RESOURCES = {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "1500m", "memory": "128Mi"}}


@pytest.mark.parametrize(
    ("selector", "resources", "expected"),
    [
        ({"resource": "limits.cpu"}, RESOURCES, "2"),  # 1.5 cores rounds up
        ({"resource": "limits.cpu", "divisor": "1m"}, RESOURCES, "1500"),
        ({"resource": "requests.cpu", "divisor": "1m"}, RESOURCES, "250"),
        ({"resource": "requests.cpu"}, RESOURCES, "1"),
        ({"resource": "requests.cpu", "divisor": "100m"}, RESOURCES, "3"),
        ({"resource": "limits.memory"}, RESOURCES, "134217728"),
        ({"resource": "limits.memory", "divisor": "1Mi"}, RESOURCES, "128"),
        ({"resource": "requests.memory", "divisor": "1M"}, RESOURCES, "68"),  # 67.1 MB rounds up
        ({"resource": "limits.memory", "divisor": "0"}, RESOURCES, "134217728"),  # zero means 1
        # Unset limits read as node allocatable; unset requests default to the limit, else 0.
        ({"resource": "limits.cpu", "divisor": "1m"}, {}, "4000"),
        ({"resource": "limits.memory", "divisor": "1Gi"}, {}, "8"),
        ({"resource": "limits.ephemeral-storage", "divisor": "1G"}, {}, "100"),
        ({"resource": "requests.cpu", "divisor": "1m"}, {"limits": {"cpu": "300m"}}, "300"),
        ({"resource": "requests.memory"}, {}, "0"),
    ],
)
def test_resource_field_refs(selector, resources, expected):
    pod = _pod(env=[{"name": "X", "valueFrom": {"resourceFieldRef": selector}}], resources=resources)
    env = _resolve(pod, node_allocatable={"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100G"})
    assert env == [("X", expected)]


def test_resource_field_ref_of_another_container():
    pod = _pod(env=[{"name": "X", "valueFrom": {"resourceFieldRef": {
        "resource": "limits.memory", "divisor": "1Mi", "containerName": "side"}}}])
    pod["spec"]["initContainers"] = [{"name": "side", "resources": {"limits": {"memory": "32Mi"}}}]
    assert _resolve(pod) == [("X", "32")]


def test_expand_command_and_args():
    container = {"command": ["/bin/$(SHELL)", "-c"], "args": ["echo $(MSG) $$(MSG) $(NOPE)", "$(EMPTY)"]}
    command, args = expand_command(container, [("SHELL", "sh"), ("MSG", "hi"), ("EMPTY", "")])
    assert command == ["/bin/sh", "-c"]
    assert args == ["echo hi $(MSG) $(NOPE)", ""]
    assert expand_command({}, []) == ([], [])


def test_the_kubernetes_service_variables_point_where_the_agent_reaches_the_api():
    from edgelet.api.env import api_server_address, kubernetes_service_env

    assert api_server_address("https://10.0.0.1:6443") == ("10.0.0.1", 6443)
    assert api_server_address("https://api.example.com") == ("api.example.com", 443)
    assert api_server_address("https://10.0.0.1:6443", "10.96.0.1", 443) == ("10.96.0.1", 443)
    assert kubernetes_service_env("10.0.0.1", 6443) == {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "6443", "KUBERNETES_PORT": "tcp://10.0.0.1:6443",
        "KUBERNETES_PORT_6443_TCP": "tcp://10.0.0.1:6443", "KUBERNETES_PORT_6443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_6443_TCP_PORT": "6443", "KUBERNETES_PORT_6443_TCP_ADDR": "10.0.0.1"}
    assert kubernetes_service_env("fd00::1", 443)["KUBERNETES_PORT"] == "tcp://[fd00::1]:443"
    assert api_server_address("https://[fd00::1]:6443") == ("fd00::1", 6443)


def test_service_variables_come_last_and_a_container_can_override_them():
    pod = _pod([{"name": "KUBERNETES_SERVICE_PORT", "value": "1"},
                {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST)"}])
    env = resolve_env(pod, pod["spec"]["containers"][0], store=None,
                      service_env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert env == [("KUBERNETES_SERVICE_PORT", "1"), ("URL", "https://10.0.0.1"),
                   ("KUBERNETES_SERVICE_HOST", "10.0.0.1")]


# -- Service variables ---------------------------------------------------------------------------------


def _service(name, namespace="apps", cluster_ip="10.96.0.10", ports=({"port": 80},)):
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": cluster_ip, "ports": [dict(p) for p in ports]}}


def test_service_variables_of_one_service_with_named_ports_and_protocols():
    from edgelet.api.env import service_variables

    web = _service("my-web", ports=({"name": "http", "port": 8080, "protocol": "TCP"},
                                     {"name": "dns-udp", "port": 53, "protocol": "UDP"}))
    assert service_variables([web]) == {
        "MY_WEB_SERVICE_HOST": "10.96.0.10", "MY_WEB_SERVICE_PORT": "8080",
        "MY_WEB_SERVICE_PORT_HTTP": "8080", "MY_WEB_SERVICE_PORT_DNS_UDP": "53",
        "MY_WEB_PORT": "tcp://10.96.0.10:8080",
        "MY_WEB_PORT_8080_TCP": "tcp://10.96.0.10:8080", "MY_WEB_PORT_8080_TCP_PROTO": "tcp",
        "MY_WEB_PORT_8080_TCP_PORT": "8080", "MY_WEB_PORT_8080_TCP_ADDR": "10.96.0.10",
        "MY_WEB_PORT_53_UDP": "udp://10.96.0.10:53", "MY_WEB_PORT_53_UDP_PROTO": "udp",
        "MY_WEB_PORT_53_UDP_PORT": "53", "MY_WEB_PORT_53_UDP_ADDR": "10.96.0.10"}
    # An unnamed first port has no _SERVICE_PORT_<NAME>; no protocol reads as TCP; IPv6 addresses get brackets.
    assert service_variables([_service("fooservice", ports=({"port": 8765},))]) == {
        "FOOSERVICE_SERVICE_HOST": "10.96.0.10", "FOOSERVICE_SERVICE_PORT": "8765",
        "FOOSERVICE_PORT": "tcp://10.96.0.10:8765", "FOOSERVICE_PORT_8765_TCP": "tcp://10.96.0.10:8765",
        "FOOSERVICE_PORT_8765_TCP_PROTO": "tcp", "FOOSERVICE_PORT_8765_TCP_PORT": "8765",
        "FOOSERVICE_PORT_8765_TCP_ADDR": "10.96.0.10"}
    assert service_variables([_service("v6", cluster_ip="fd00::a")])["V6_PORT_80_TCP"] == "tcp://[fd00::a]:80"


MASTER = _service("kubernetes", "default", "10.96.0.1", ({"name": "https", "port": 443},))


@pytest.mark.parametrize(("namespace", "links", "services", "expected"), [
    # The pod's own namespace and the master service; other namespaces never.
    ("apps", True, [MASTER, _service("a"), _service("b", "other")], ["a", "kubernetes"]),
    # enableServiceLinks false: only the master service.
    ("apps", False, [MASTER, _service("a")], ["kubernetes"]),
    # Headless ("None") and ExternalName (no cluster IP) services are skipped, the master's too.
    ("apps", True, [_service("kubernetes", "default", "None"), _service("h", cluster_ip="None"),
                    _service("x", cluster_ip="")], []),
    # A service of its own called `kubernetes` wins over the master's, whichever comes first.
    ("apps", True, [MASTER, _service("kubernetes", cluster_ip="10.96.9.9")], ["kubernetes@10.96.9.9"]),
    ("apps", True, [_service("kubernetes", cluster_ip="10.96.9.9"), MASTER], ["kubernetes@10.96.9.9"]),
    # Links disabled: the pod's own `kubernetes` is not taken, the master's is.
    ("apps", False, [_service("kubernetes", cluster_ip="10.96.9.9"), MASTER], ["kubernetes@10.96.0.1"]),
    # A pod of the default namespace: the master service is one of its own.
    ("default", True, [MASTER, _service("db", "default")], ["db", "kubernetes"]),
])
def test_which_services_a_pod_is_told_about(namespace, links, services, expected):
    from edgelet.api.env import services_for

    chosen = services_for(namespace, links, services)
    names = [s["metadata"]["name"] for s in chosen]
    if any("@" in e for e in expected):
        names = [f"{s['metadata']['name']}@{s['spec']['clusterIP']}" for s in chosen]
    assert names == expected


def test_a_pods_service_env_follows_enable_service_links():
    from edgelet.api.env import pod_service_env

    services = [MASTER, _service("db", ports=({"port": 5432},))]
    pod = {"metadata": {"name": "p", "namespace": "apps"}, "spec": {"containers": [{"name": "c"}]}}
    assert pod_service_env(pod, services)["DB_SERVICE_PORT"] == "5432"  # unset means true, as defaulted
    pod["spec"]["enableServiceLinks"] = False
    assert pod_service_env(pod, services) == {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}


def test_the_informer_refuses_api_pods_until_it_listed_and_puts_the_agents_api_address_for_the_master():
    from edgelet.api.env import EnvError, kubernetes_service
    from edgelet.cluster.services import NOT_SYNCED, ServiceInformer, service_problem

    informer = ServiceInformer(None, master=kubernetes_service("192.0.2.7", 6443))
    pod = {"metadata": {"name": "p", "namespace": "apps"}, "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(EnvError, match=NOT_SYNCED):
        informer.env_for(pod)
    static = {"metadata": {"name": "s", "namespace": "apps",
                           "annotations": {"kubernetes.io/config.source": "file"}}, "spec": {}}
    assert informer.env_for(static)["KUBERNETES_SERVICE_HOST"] == "192.0.2.7"
    kept = [informer.keep(s) for s in ({**MASTER, "metadata": {**MASTER["metadata"], "uid": "u", "labels": {"a": "b"}}},
                                       _service("db", ports=({"port": 5432, "targetPort": 5432},)))]
    assert kept[0]["metadata"] == {"name": "kubernetes", "namespace": "default"}
    assert kept[1]["spec"]["ports"] == [{"port": 5432}]  # only what the variables read
    informer.handle.set(kept)
    informer.handle.mark_ready()
    env = informer.env_for(pod)
    assert env["KUBERNETES_SERVICE_HOST"] == "192.0.2.7" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["DB_SERVICE_HOST"] == "10.96.0.10"
    assert informer.selector == {"fieldSelector": "spec.clusterIP!=None"}
    assert service_problem(_service("ok")) is None
    assert "numeric port" in service_problem(_service("bad", ports=({"port": "80"},)))
    assert "metadata.namespace" in service_problem({"metadata": {"name": "x"}, "spec": {}})


async def test_an_unanswering_api_server_is_not_waited_for():
    """Offline, cached API pods start with what is known (the master Service's variables), and new pods are not
    held up by a first list that cannot come."""
    from edgelet.api.env import kubernetes_service
    from edgelet.cluster.services import ServiceInformer
    from edgelet.kubeapi.errors import ServerError

    answers = False
    informer = ServiceInformer(None, master=kubernetes_service("192.0.2.7", 6443), api_answers=lambda: answers)
    pod = {"metadata": {"name": "p", "namespace": "apps"}, "spec": {"containers": [{"name": "c"}]}}
    assert informer.env_for(pod)["KUBERNETES_SERVICE_HOST"] == "192.0.2.7"
    informer._failed(ServerError(0, "ConnectionError", "refused", method="GET", path="/api/v1/services"))
    await asyncio.wait_for(informer.wait_synced(30), 1)
    answers = True
    with pytest.raises(Exception, match="services have not yet been read"):
        informer.env_for(pod)
