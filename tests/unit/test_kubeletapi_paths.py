"""The kubelet API's pure request decisions: routes, path -> nodes subresource, verbs and query parsing."""

from __future__ import annotations

import pytest

from edgelet.kubeletapi.paths import (
    BadRequest,
    LogOptions,
    Route,
    StreamOptions,
    parse_log_options,
    parse_ports,
    parse_rfc3339_ns,
    parse_route,
    parse_stream_options,
    subresource_for,
    verb_for,
)

NOW = 1_700_000_000 * 10**9


@pytest.mark.parametrize("path, subresource", [
    ("/stats/summary", "stats"),
    ("/stats", "stats"),
    ("/stats/container/x", "stats"),
    ("/metrics", "metrics"),
    ("/metrics/resource", "metrics"),
    ("/metrics/cadvisor", "metrics"),
    ("/metrics/probes", "metrics"),
    ("/logs/", "log"),
    ("/logs/syslog", "log"),
    ("/spec/", "spec"),
    ("/exec/default/web/app", "proxy"),
    ("/attach/default/web/app", "proxy"),
    ("/portForward/default/web", "proxy"),
    ("/run/default/web/app", "proxy"),
    ("/containerLogs/default/web/app", "proxy"),
    ("/pods", "proxy"),
    ("/healthz", "proxy"),
    ("/statsfoo", "proxy"),  # a prefix of a word is not the subresource
    ("/", "proxy"),
])
def test_subresource_for(path, subresource):
    assert subresource_for(path) == subresource


@pytest.mark.parametrize("method, verb", [
    ("GET", "get"), ("HEAD", "get"), ("POST", "create"), ("PUT", "update"), ("PATCH", "patch"),
    ("DELETE", "delete"), ("OPTIONS", ""), ("get", "get"),
])
def test_verb_for(method, verb):
    assert verb_for(method) == verb


@pytest.mark.parametrize("path, route", [
    ("/healthz", Route("healthz")),
    ("/pods", Route("pods")),
    ("/pods/", Route("pods")),
    ("/stats/summary", Route("stats/summary")),
    ("/metrics/resource", Route("metrics/resource")),
    ("/metrics", Route("metrics")),
    ("/metrics/cadvisor", Route("metrics/cadvisor")),
    ("/metrics/probes", Route("metrics/probes")),
    ("/metrics/other", None),
    ("/containerLogs/ns/pod/c", Route("containerLogs", "ns", "pod", container="c")),
    ("/exec/ns/pod/c", Route("exec", "ns", "pod", container="c")),
    ("/exec/ns/pod/uid-1/c", Route("exec", "ns", "pod", uid="uid-1", container="c")),
    ("/attach/ns/pod/c", Route("attach", "ns", "pod", container="c")),
    ("/run/ns/pod/uid-1/c", Route("run", "ns", "pod", uid="uid-1", container="c")),
    ("/portForward/ns/pod", Route("portForward", "ns", "pod")),
    ("/portForward/ns/pod/uid-1", Route("portForward", "ns", "pod", uid="uid-1")),
    ("/containerLogs/ns/pod", None),
    ("/containerLogs/ns/pod/uid/c", None),
    ("/exec/ns//c", None),
    ("/exec/ns/pod", None),
    ("/portForward/ns", None),
    ("/logs/", Route("logs")),
    ("/logs", Route("logs")),
    ("/logs/journal/x.log", Route("logs", path="journal/x.log")),
    ("/nothing", None),
])
def test_parse_route(path, route):
    assert parse_route(path) == route


def test_streaming_routes():
    assert [e for e in ("exec", "attach", "portForward", "run", "containerLogs") if Route(e).streaming] == \
        ["exec", "attach", "portForward"]


@pytest.mark.parametrize("text, ns", [
    ("2023-11-14T22:13:20Z", NOW),
    ("2023-11-14T22:13:20.5Z", NOW + 500_000_000),
    ("2023-11-14T22:13:20.000000001Z", NOW + 1),
    ("2023-11-14T23:13:20.25+01:00", NOW + 250_000_000),
])
def test_parse_rfc3339_ns(text, ns):
    assert parse_rfc3339_ns(text) == ns


@pytest.mark.parametrize("text", ["2023-11-14T22:13:20", "yesterday", "2023-11-14T22:13:20.Z",
                                  "2023-11-14T22:13:20.1234567890Z"])
def test_parse_rfc3339_ns_rejects(text):
    with pytest.raises(ValueError):
        parse_rfc3339_ns(text)


@pytest.mark.parametrize("query, options", [
    ({}, LogOptions()),
    ({"follow": ["true"], "previous": ["1"], "timestamps": ["True"]},
     LogOptions(follow=True, previous=True, timestamps=True)),
    ({"follow": ["false"], "tailLines": ["0"]}, LogOptions(tail_lines=0)),
    ({"tailLines": ["10"], "limitBytes": ["100"]}, LogOptions(tail_lines=10, limit_bytes=100)),
    ({"sinceSeconds": ["5"]}, LogOptions(since_ns=NOW - 5 * 10**9)),
    ({"sinceTime": ["2023-11-14T22:13:20Z"]}, LogOptions(since_ns=NOW)),
    ({"tailLines": [""]}, LogOptions()),
])
def test_parse_log_options(query, options):
    assert parse_log_options(query, now_ns=NOW) == options


@pytest.mark.parametrize("query, names", [
    ({"tailLines": ["-1"]}, "tailLines"),
    ({"tailLines": ["ten"]}, "tailLines"),
    ({"limitBytes": ["0"]}, "limitBytes"),
    ({"sinceSeconds": ["0"]}, "sinceSeconds"),
    ({"sinceTime": ["yesterday"]}, "sinceTime"),
    ({"sinceTime": ["2023-11-14T22:13:20Z"], "sinceSeconds": ["5"]}, "sinceTime or sinceSeconds"),
    ({"follow": ["maybe"]}, "follow"),
])
def test_parse_log_options_rejects_naming_the_parameter(query, names):
    with pytest.raises(BadRequest, match=names):
        parse_log_options(query, now_ns=NOW)


@pytest.mark.parametrize("endpoint, query, options", [
    # The API server's spelling for the kubelet: input/output/error with "1".
    ("exec", {"command": ["sh", "-c", "echo hi"], "output": ["1"], "error": ["1"]},
     StreamOptions(("sh", "-c", "echo hi"), stdout=True, stderr=True)),
    # A direct client's spelling: stdin/stdout/stderr with "true".
    ("exec", {"command": ["cat"], "stdin": ["true"], "stdout": ["true"]},
     StreamOptions(("cat",), stdin=True, stdout=True)),
    ("exec", {"command": ["sh"], "input": ["1"], "output": ["1"], "error": ["1"], "tty": ["1"]},
     StreamOptions(("sh",), stdin=True, stdout=True, stderr=False, tty=True)),
    ("attach", {"output": ["1"]}, StreamOptions(stdout=True)),
    ("attach", {"output": ["1"], "command": ["ignored"]}, StreamOptions(stdout=True)),
    ("run", {"cmd": ["cat /etc/hostname"]}, StreamOptions(("cat", "/etc/hostname"))),
])
def test_parse_stream_options(endpoint, query, options):
    assert parse_stream_options(endpoint, query) == options


@pytest.mark.parametrize("endpoint, query, message", [
    ("exec", {"output": ["1"]}, "command"),
    ("exec", {"command": ["true"]}, "at least 1 of stdin, stdout, stderr"),
    ("attach", {}, "at least 1"),
    ("run", {}, "cmd"),
    ("exec", {"command": ["true"], "output": ["yes please"]}, "output"),
])
def test_parse_stream_options_rejects(endpoint, query, message):
    with pytest.raises(BadRequest, match=message):
        parse_stream_options(endpoint, query)


def test_parse_ports():
    assert parse_ports({"port": ["80", "8080,9090"]}) == (80, 8080, 9090)
    assert parse_ports({}) == ()
    for bad in ("0", "65536", "http"):
        with pytest.raises(BadRequest, match="port"):
            parse_ports({"port": [bad]})
