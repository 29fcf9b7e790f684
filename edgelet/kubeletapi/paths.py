"""What a kubelet API request asks for, decided from its method, path and query alone (pure, table-tested).

Paths, query parameters and the path -> `nodes/<subresource>` mapping follow the kubelet's server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgelet.api.kubetime import parse_rfc3339_ns

# Endpoints that take a container (or, for portForward, only a pod) and may carry the pod's uid.
_CONTAINER_ENDPOINTS = ("containerLogs", "exec", "attach", "run")
_STREAMING_ENDPOINTS = ("exec", "attach", "portForward")
_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/spec", "spec"))


class BadRequest(ValueError):
    """A request the kubelet answers with 400; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint with the pod and container it names ("" where the endpoint has none)."""

    endpoint: str
    namespace: str = ""
    pod: str = ""
    uid: str = ""
    container: str = ""
    path: str = ""  # /logs/<path>: under the node log directory

    @property
    def streaming(self) -> bool:
        return self.endpoint in _STREAMING_ENDPOINTS


_FIXED = {
    "/healthz": "healthz", "/pods": "pods", "/pods/": "pods", "/stats/summary": "stats/summary",
    "/stats/summary/": "stats/summary", "/metrics": "metrics", "/metrics/resource": "metrics/resource",
    "/metrics/cadvisor": "metrics/cadvisor", "/metrics/probes": "metrics/probes",
}


def parse_route(path: str) -> Route | None:
    """The endpoint of a path, or None for a path the kubelet API does not serve (404)."""
    if path in _FIXED:
        return Route(_FIXED[path])
    if path == "/logs" or path.startswith("/logs/"):
        return Route("logs", path=path[len("/logs/"):])
    parts = path.strip("/").split("/")
    endpoint, args = parts[0], parts[1:]
    if any(not part for part in args):
        return None
    if endpoint == "containerLogs" and len(args) == 3:
        return Route(endpoint, args[0], args[1], container=args[2])
    if endpoint in _CONTAINER_ENDPOINTS and endpoint != "containerLogs":
        if len(args) == 3:
            return Route(endpoint, args[0], args[1], container=args[2])
        if len(args) == 4:
            return Route(endpoint, args[0], args[1], uid=args[2], container=args[3])
    if endpoint == "portForward" and len(args) in (2, 3):
        return Route(endpoint, args[0], args[1], uid=args[2] if len(args) == 3 else "")
    return None


# -- authorization attributes --------------------------------------------------------------------

def subresource_for(path: str) -> str:
    """The `nodes` subresource a path is authorized as; everything unlisted is `proxy`."""
    for prefix, subresource in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            return subresource
    return "proxy"


def verb_for(method: str) -> str:
    """The authorization verb of an HTTP method, as the kubelet derives it ("" for others)."""
    return _VERBS.get(method.upper(), "")


# -- query parameters ----------------------------------------------------------------------------

def _one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def query_bool(query: Mapping[str, Sequence[str]], name: str) -> bool:
    """A boolean parameter: "true"/"1" (kubectl and the API server send both spellings)."""
    value = _one(query, name)
    if value is None or value == "":
        return False
    lowered = value.lower()
    if lowered in ("1", "t", "true"):
        return True
    if lowered in ("0", "f", "false"):
        return False
    raise BadRequest(f"query parameter {name}: {value!r} is not a boolean")


def _query_int(query: Mapping[str, Sequence[str]], name: str, *, minimum: int) -> int | None:
    value = _one(query, name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"query parameter {name}: {value!r} is not an integer") from None
    if number < minimum:
        raise BadRequest(f"query parameter {name}: must be at least {minimum}, got {number}")
    return number


@dataclass(frozen=True, slots=True)
class LogOptions:
    """The query of /containerLogs (core/v1 PodLogOptions); since_ns is absolute, None when unset."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_ns: int | None = None


def parse_log_options(query: Mapping[str, Sequence[str]], *, now_ns: int) -> LogOptions:
    """Reads the log query; sinceSeconds counts back from now_ns. BadRequest names a bad parameter."""
    since_seconds = _query_int(query, "sinceSeconds", minimum=1)
    since_time = _one(query, "sinceTime")
    if since_seconds is not None and since_time:
        raise BadRequest("at most one of sinceTime or sinceSeconds may be specified")
    since_ns = None
    if since_seconds is not None:
        since_ns = now_ns - since_seconds * 1_000_000_000
    elif since_time:
        try:
            since_ns = parse_rfc3339_ns(since_time)
        except ValueError:
            raise BadRequest(f"query parameter sinceTime: {since_time!r} is not an RFC 3339 time") from None
    return LogOptions(
        follow=query_bool(query, "follow"),
        previous=query_bool(query, "previous"),
        timestamps=query_bool(query, "timestamps"),
        tail_lines=_query_int(query, "tailLines", minimum=0),
        limit_bytes=_query_int(query, "limitBytes", minimum=1),
        since_ns=since_ns,
    )


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """The query of /exec, /attach and /run."""

    command: tuple[str, ...] = ()
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False
    tty: bool = False


def parse_stream_options(endpoint: str, query: Mapping[str, Sequence[str]]) -> StreamOptions:
    """exec needs a command and a stream; a terminal has one output stream, so tty drops stderr."""
    if endpoint == "run":
        command = tuple((_one(query, "cmd") or "").split())
        if not command:
            raise BadRequest("query parameter cmd: a command is required")
        return StreamOptions(command=command)
    command = tuple(query.get("command", ())) if endpoint == "exec" else ()
    tty = query_bool(query, "tty")
    options = StreamOptions(
        command=command, stdin=query_bool(query, "input") or query_bool(query, "stdin"),
        stdout=query_bool(query, "output") or query_bool(query, "stdout"),
        stderr=query_bool(query, "error") or query_bool(query, "stderr"), tty=tty,
    )
    if endpoint == "exec" and not command:
        raise BadRequest("query parameter command: a command is required")
    if not (options.stdin or options.stdout or options.stderr):
        raise BadRequest("you must specify at least 1 of stdin, stdout, stderr")
    if tty and options.stderr:
        options = StreamOptions(command, options.stdin, options.stdout, False, True)
    return options


def parse_ports(query: Mapping[str, Sequence[str]]) -> tuple[int, ...]:
    """Ports named in a port-forward query (`port=8080`); the SPDY client names them per stream instead."""
    ports = []
    for value in query.get("port", ()):
        for item in value.split(","):
            if not item.isdigit() or not 0 < int(item) < 65536:
                raise BadRequest(f"query parameter port: {item!r} is not a port number")
            ports.append(int(item))
    return tuple(ports)
