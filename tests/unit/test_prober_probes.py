"""The pure parts of probes and hooks: spec parsing and defaults, ports, URLs, headers, HTTP status
ranges, exec command expansion, the grpc health wire format and the preStop grace arithmetic."""

from __future__ import annotations

import pytest

from edgelet.prober.hooks import remaining_grace
from edgelet.prober.probes import (
    HOOK_HANDLERS,
    ProbeSpec,
    decode_health_response,
    encode_health_request,
    expand_static,
    http_headers,
    http_result,
    http_url,
    parse_handler,
    parse_probe,
    resolve_port,
    serving_status_name,
    user_agent,
)
from edgelet.prober.results import ProbeError, ProbeType, Result
from edgelet.util.errors import ConfigError

CONTAINER = {"name": "app",
             "ports": [{"name": "http", "containerPort": 8080}, {"name": "admin", "containerPort": 9000}]}


def parse(probe, probe_type=ProbeType.READINESS):
    return parse_probe(probe, "pod web_default", "spec.containers[app].readinessProbe", probe_type)


def test_probe_defaults_are_the_apis():
    spec = parse({"tcpSocket": {"port": 80}})
    assert spec == ProbeSpec(handler="tcpSocket", action={"port": 80}, initial_delay=0, period=10, timeout=1,
                             success_threshold=1, failure_threshold=3)
    # zero means unset, as the API server's defaulting treats it
    assert parse({"exec": {"command": ["true"]}, "periodSeconds": 0, "timeoutSeconds": 0}).period == 10


def test_probe_timings_are_taken():
    spec = parse({"grpc": {"port": 9090}, "initialDelaySeconds": 5, "periodSeconds": 2, "timeoutSeconds": 3,
                  "successThreshold": 2, "failureThreshold": 7})
    assert (spec.initial_delay, spec.period, spec.timeout, spec.success_threshold, spec.failure_threshold) == (
        5, 2, 3, 2, 7)


@pytest.mark.parametrize("probe, field, words", [
    ({}, "readinessProbe", "exactly one of exec, httpGet, tcpSocket, grpc (has none)"),
    ({"exec": {"command": ["x"]}, "tcpSocket": {"port": 1}}, "readinessProbe", "(has 2)"),
    ({"exec": {"command": []}}, "readinessProbe.exec.command", "non-empty list"),
    ({"exec": {"command": "true"}}, "readinessProbe.exec.command", "non-empty list"),
    ({"httpGet": {"path": "/"}}, "readinessProbe.httpGet.port", "port number"),
    ({"httpGet": {"port": 70000}}, "readinessProbe.httpGet.port", "port number"),
    ({"httpGet": {"port": 80, "scheme": "FTP"}}, "readinessProbe.httpGet.scheme", "HTTP or HTTPS"),
    ({"httpGet": {"port": 80, "httpHeaders": [{"value": "x"}]}}, "readinessProbe.httpGet.httpHeaders", "name"),
    ({"grpc": {"port": "grpc"}}, "readinessProbe.grpc.port", "port number (1-65535), not"),
    ({"tcpSocket": {"port": 80}, "periodSeconds": -1}, "readinessProbe.periodSeconds", ">= 1"),
    ({"tcpSocket": {"port": 80}, "periodSeconds": "10"}, "readinessProbe.periodSeconds", "integer"),
    ({"tcpSocket": {"port": 80}, "failureThreshold": True}, "readinessProbe.failureThreshold", "integer"),
    ({"tcpSocket": {"port": 80}, "initialDelaySeconds": -5}, "readinessProbe.initialDelaySeconds", ">= 0"),
    ("tcp", "readinessProbe", "must be an object"),
])
def test_bad_probes_name_the_field(probe, field, words):
    with pytest.raises(ConfigError) as caught:
        parse(probe)
    assert caught.value.key == f"spec.containers[app].{field}"
    assert caught.value.path == "pod web_default"
    assert words in str(caught.value)


def test_liveness_and_startup_need_a_success_threshold_of_one():
    probe = {"tcpSocket": {"port": 80}, "successThreshold": 2}
    assert parse(probe).success_threshold == 2
    for probe_type in (ProbeType.LIVENESS, ProbeType.STARTUP):
        with pytest.raises(ConfigError, match="successThreshold"):
            parse(probe, probe_type)


def test_hook_handlers():
    assert parse_handler({"sleep": {"seconds": 5}}, "pod p", "lifecycle.preStop", HOOK_HANDLERS)[0] == "sleep"
    for bad in ({"tcpSocket": {"port": 80}}, {"sleep": {"seconds": -1}}, {"sleep": {}}):
        with pytest.raises(ConfigError):
            parse_handler(bad, "pod p", "lifecycle.preStop", HOOK_HANDLERS)


@pytest.mark.parametrize("port, expected", [
    (80, 80), ("http", 8080), ("admin", 9000), ("8443", 8443), (65535, 65535)])
def test_resolve_port(port, expected):
    assert resolve_port(port, CONTAINER) == expected


@pytest.mark.parametrize("port", ["metrics", 0, 65536, "0", "-1"])
def test_unresolvable_ports_are_errors_not_failures(port):
    with pytest.raises(ProbeError):
        resolve_port(port, CONTAINER)


@pytest.mark.parametrize("action, pod_ip, url", [
    ({"port": 8080, "path": "/healthz"}, "10.1.0.5", "http://10.1.0.5:8080/healthz"),
    ({"port": "http"}, "10.1.0.5", "http://10.1.0.5:8080/"),
    ({"port": 443, "scheme": "HTTPS", "path": "ready?full=1"}, "10.1.0.5", "https://10.1.0.5:443/ready?full=1"),
    ({"port": 80, "host": "127.0.0.1"}, "10.1.0.5", "http://127.0.0.1:80/"),
    ({"port": 80, "host": "127.0.0.1"}, "", "http://127.0.0.1:80/"),
    ({"port": 80, "path": "/x"}, "fd00::5", "http://[fd00::5]:80/x"),
])
def test_http_url(action, pod_ip, url):
    assert http_url(action, CONTAINER, pod_ip) == url


def test_http_url_without_an_address_is_an_error():
    with pytest.raises(ProbeError, match="no IP"):
        http_url({"port": 80}, CONTAINER, "")


def test_http_headers():
    assert http_headers(None, "probe") == [
        ("User-Agent", user_agent("probe")), ("Accept", "*/*"), ("Connection", "close")]
    declared = [{"name": "user-agent", "value": "mine"}, {"name": "X-Token", "value": "a"},
                {"name": "X-Token", "value": "b"}, {"name": "Host", "value": "example.test"}]
    assert http_headers(declared, "lifecycle") == [
        ("user-agent", "mine"), ("X-Token", "a"), ("X-Token", "b"), ("Host", "example.test"),
        ("Accept", "*/*"), ("Connection", "close")]
    # a declared empty Accept removes the header
    assert ("Accept", "") not in http_headers([{"name": "Accept", "value": ""}], "probe")
    assert ("Accept", "text/plain") in http_headers([{"name": "Accept", "value": "text/plain"}], "probe")


def test_user_agent_names_the_purpose_and_a_kubernetes_version():
    agent = user_agent("probe")
    assert agent.startswith("kube-probe/1.")
    assert user_agent("lifecycle").startswith("kube-lifecycle/1.")


@pytest.mark.parametrize("status, result", [
    (100, Result.FAILURE), (199, Result.FAILURE), (200, Result.SUCCESS), (204, Result.SUCCESS),
    (301, Result.SUCCESS), (399, Result.SUCCESS), (400, Result.FAILURE), (404, Result.FAILURE),
    (500, Result.FAILURE), (503, Result.FAILURE)])
def test_http_status_ranges(status, result):
    assert http_result(status) is result


def test_exec_commands_expand_literal_env_only():
    container = {"env": [{"name": "PORT", "value": "8080"},
                         {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    command = ["check", "--port=$(PORT)", "$(SECRET)", "$(MISSING)", "$$(PORT)"]
    assert expand_static(command, container) == ["check", "--port=8080", "", "$(MISSING)", "$(PORT)"]


@pytest.mark.parametrize("service, wire", [
    ("", b""), ("foo", b"\x0a\x03foo"), ("x" * 200, b"\x0a\xc8\x01" + b"x" * 200)])
def test_health_request_encoding(service, wire):
    assert encode_health_request(service) == wire


@pytest.mark.parametrize("wire, status", [
    (b"", 0), (b"\x08\x01", 1), (b"\x08\x02", 2), (b"\x08\x03", 3),
    # unknown fields of every wire type are skipped
    (b"\x12\x02hi\x08\x01", 1), (b"\x08\x02\x19" + b"\0" * 8 + b"\x25" + b"\0" * 4 + b"\x08\x01", 1),
])
def test_health_response_decoding(wire, status):
    assert decode_health_response(wire) == status


@pytest.mark.parametrize("wire", [b"\x08", b"\x12\x05hi", b"\x0b"])
def test_health_response_garbage(wire):
    with pytest.raises(ValueError):
        decode_health_response(wire)


@pytest.mark.parametrize("grace, elapsed, remaining", [
    (30, 0.0, 30), (30, 0.9, 30), (30, 10.9, 20), (30, 27.5, 3), (30, 29, 2), (30, 45, 2), (5, 4, 2), (2, 0, 2)])
def test_pre_stop_grace(grace, elapsed, remaining):
    assert remaining_grace(grace, elapsed) == remaining


@pytest.mark.parametrize("status, name", [(0, "UNKNOWN"), (1, "SERVING"), (2, "NOT_SERVING"),
                                          (3, "SERVICE_UNKNOWN"), (7, "7")])
def test_serving_status_names(status, name):
    assert serving_status_name(status) == name
