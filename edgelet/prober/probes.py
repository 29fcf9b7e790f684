"""The probe and hook actions: their spec (parsed and checked once) and the checks themselves.

exec runs through CRI ExecSync, httpGet through edgelet.util.http11, tcpSocket is a plain connect and grpc calls
grpc.health.v1.Health/Check with the messages generated from health_v1.proto. The rules follow the kubelet's
pkg/probe: failures are verdicts about the container; errors (nothing could be asked) are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urljoin, urlsplit

from google.protobuf.message import DecodeError
from grpc import StatusCode, aio

from edgelet import KUBELET_COMPAT_VERSION
from edgelet.api.env import expand
from edgelet.cri import RuntimeCallError
from edgelet.prober import health_v1_pb2
from edgelet.util.errors import ConfigError, EdgeletError
from edgelet.util.http11 import Connection, HttpError, Origin

from .results import Outcome, ProbeError, ProbeType, Result

# kube-probe/<major>.<minor>: servers that single out probes match on this User-Agent.
_KUBE_MINOR = ".".join(KUBELET_COMPAT_VERSION.removeprefix("v").split(".")[:2])
MAX_REDIRECTS = 10  # Go's http.Client limit, which the kubelet keeps for same-host redirects
MAX_OUTPUT_BYTES = 10 * 1024  # the kubelet keeps at most this much of a probe's output
PROBE_RETRIES = 3  # attempts when a probe errors (maxProbeRetries)
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})

PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
HOOK_HANDLERS = ("exec", "httpGet", "sleep")


def user_agent(purpose: str) -> str:
    """`kube-probe/1.32` for probes, `kube-lifecycle/1.32` for hooks, as the kubelet sends them."""
    return f"kube-{purpose}/{_KUBE_MINOR}"


# -- the spec ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """A container probe with the API defaults applied; `action` is the handler's own dict."""

    handler: str  # one of PROBE_HANDLERS
    action: Mapping[str, Any]
    initial_delay: int = 0
    period: int = 10
    timeout: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3


_PROBE_TIMING = (
    # (field, attribute, default, minimum)
    ("initialDelaySeconds", "initial_delay", 0, 0),
    ("periodSeconds", "period", 10, 1),
    ("timeoutSeconds", "timeout", 1, 1),
    ("successThreshold", "success_threshold", 1, 1),
    ("failureThreshold", "failure_threshold", 3, 1),
)


def parse_probe(probe: Any, where: str, field: str, probe_type: ProbeType) -> ProbeSpec:
    """The ProbeSpec of `probe` (a container's `<type>Probe` dict), or ConfigError naming the field.

    `where` names the pod, `field` the probe's path in the pod, e.g. `spec.containers[web].livenessProbe`.
    Unset or zero timings take the API defaults, as the API server's defaulting gives them.
    """
    if not isinstance(probe, Mapping):
        raise ConfigError(where, field, "must be an object")
    handler, action = parse_handler(probe, where, field, PROBE_HANDLERS)
    timings: dict[str, int] = {}
    for key, attribute, default, minimum in _PROBE_TIMING:
        value = probe.get(key)
        if value is None or value == 0:
            value = default
        if not _is_int(value) or value < minimum:
            raise ConfigError(where, f"{field}.{key}", f"must be an integer >= {minimum}, not {value!r}")
        timings[attribute] = value
    if probe_type is not ProbeType.READINESS and timings["success_threshold"] != 1:
        raise ConfigError(where, f"{field}.successThreshold", "must be 1 for liveness and startup probes")
    return ProbeSpec(handler=handler, action=action, **timings)


def parse_handler(
    spec: Mapping[str, Any], where: str, field: str, allowed: Sequence[str]
) -> tuple[str, Mapping[str, Any]]:
    """(handler name, its dict) of a probe or lifecycle hook, checked; exactly one handler is set."""
    present = [name for name in allowed if spec.get(name) is not None]
    if len(present) != 1:
        choices = ", ".join(allowed)
        problem = "has none" if not present else f"has {len(present)}"
        raise ConfigError(where, field, f"must set exactly one of {choices} ({problem})")
    name = present[0]
    action = spec[name]
    at = f"{field}.{name}"
    if not isinstance(action, Mapping):
        raise ConfigError(where, at, "must be an object")
    if name == "exec":
        command = action.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(p, str) for p in command):
            raise ConfigError(where, f"{at}.command", "must be a non-empty list of strings")
    elif name in ("httpGet", "tcpSocket", "grpc"):
        _check_port(action.get("port"), where, f"{at}.port", named=name != "grpc")
        for key in ("host", "path", "service"):
            if action.get(key) is not None and not isinstance(action[key], str):
                raise ConfigError(where, f"{at}.{key}", "must be a string")
        if name == "httpGet":
            _check_http(action, where, at)
    elif name == "sleep":
        seconds = action.get("seconds")
        if not _is_int(seconds) or seconds < 0:
            raise ConfigError(where, f"{at}.seconds", f"must be an integer >= 0, not {seconds!r}")
    return name, action


def _check_port(port: Any, where: str, field: str, *, named: bool) -> None:
    if _is_int(port) and 0 < port < 65536:
        return
    if named and isinstance(port, str) and port:
        return
    kind = "a port number (1-65535) or a port name" if named else "a port number (1-65535)"
    raise ConfigError(where, field, f"must be {kind}, not {port!r}")


def _check_http(action: Mapping[str, Any], where: str, at: str) -> None:
    scheme = action.get("scheme")
    if scheme is not None and str(scheme).upper() not in ("HTTP", "HTTPS"):
        raise ConfigError(where, f"{at}.scheme", f"must be HTTP or HTTPS, not {scheme!r}")
    headers = action.get("httpHeaders") or []
    if not isinstance(headers, list) or not all(
            isinstance(h, Mapping) and isinstance(h.get("name"), str) and h["name"]
            and isinstance(h.get("value", ""), str) for h in headers):
        raise ConfigError(where, f"{at}.httpHeaders", "must be a list of {name, value} strings")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# -- pure pieces of a check ----------------------------------------------------------------------


def resolve_port(port: Any, container: Mapping[str, Any]) -> int:
    """A probe port: a number, a name from the container's ports, or a number written as a string."""
    if isinstance(port, str):
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                port = declared.get("containerPort", -1)
                break
        else:
            try:
                port = int(port)
            except ValueError:
                raise ProbeError(f"port {port!r} is not among the container's ports") from None
    if not _is_int(port) or not 0 < port < 65536:
        raise ProbeError(f"invalid port number: {port}")
    return port


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def http_url(action: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str) -> str:
    """The URL an httpGet action asks for; its host defaults to the pod's IP."""
    scheme = str(action.get("scheme") or "HTTP").lower()
    host = action.get("host") or pod_ip
    if not host:
        raise ProbeError("the pod has no IP address yet")
    port = resolve_port(action.get("port"), container)
    path = action.get("path") or ""
    if not path.startswith("/"):
        path = "/" + path
    return f"{scheme}://{host_port(host, port)}{path}"


def http_headers(declared: Sequence[Mapping[str, str]] | None, purpose: str) -> list[tuple[str, str]]:
    """The request headers: the declared ones, then User-Agent and `Accept: */*` unless declared.

    A declared but empty Accept header removes it, as in the kubelet.
    """
    headers = [(h["name"], h.get("value", "")) for h in declared or []]
    names = {name.lower() for name, _ in headers}
    if "user-agent" not in names:
        headers.append(("User-Agent", user_agent(purpose)))
    if "accept" not in names:
        headers.append(("Accept", "*/*"))
    else:
        headers = [(n, v) for n, v in headers if n.lower() != "accept" or v]
    # Probes never reuse connections: each sees the server as a fresh client would.
    headers.append(("Connection", "close"))
    return headers


def http_result(status: int) -> Result:
    """200-399 is success (a redirect the prober did not follow counts as one), the rest failure."""
    return Result.SUCCESS if 200 <= status < 400 else Result.FAILURE


def expand_static(command: Sequence[str], container: Mapping[str, Any]) -> list[str]:
    """`$(VAR)` in an exec probe's command, from the container's literal env values only (no valueFrom)."""
    values = {e.get("name", ""): e.get("value", "") or "" for e in container.get("env") or []}
    return [expand(part, values.get) for part in command]


def describe(exc: BaseException) -> str:
    """An exception's message, or its type when it has none (timeouts often have none)."""
    return str(exc) or type(exc).__name__


def truncate(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= MAX_OUTPUT_BYTES else text[:MAX_OUTPUT_BYTES] + "..."


HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"


def encode_health_request(service: str) -> bytes:
    return health_v1_pb2.HealthCheckRequest(service=service).SerializeToString()


def decode_health_response(data: bytes) -> int:
    """The status of a HealthCheckResponse (0 when absent); ValueError when it is not one."""
    try:
        return health_v1_pb2.HealthCheckResponse.FromString(data).status
    except DecodeError as exc:
        raise ValueError(str(exc)) from exc


def serving_status_name(status: int) -> str:
    try:
        return health_v1_pb2.HealthCheckResponse.ServingStatus.Name(status)
    except ValueError:
        return str(status)


# -- the checks ------------------------------------------------------------------------------


class HttpGetError(Exception):
    """A GET that did not produce a status: connection, protocol, URL or redirect-limit trouble."""


class RedirectLimit(HttpGetError):
    pass


class HttpGetter:
    """Every probe or hook GET: one connection each (probes see the server as a fresh client would), HTTPS
    certificates not checked (as the kubelet's prober), no proxies, redirects on the same host followed."""

    def __init__(self) -> None:
        self._unverified: ssl.SSLContext | None = None

    async def get(self, url: str, headers: Sequence[tuple[str, str]], timeout: float | None) -> tuple[int, bytes]:
        """The status and body (its first MAX_OUTPUT_BYTES) of GET `url`, following redirects that stay on the
        same host (at most ten).

        Raises HttpGetError (RedirectLimit among them) or TimeoutError.
        """
        first_host = urlsplit(url).hostname
        current = url
        followed = 0
        async with asyncio.timeout(timeout):
            while True:
                status, location, body = await self._get_once(current, headers)
                if status not in _REDIRECT_CODES or not location:
                    return status, body
                next_url = urljoin(current, location)
                if urlsplit(next_url).hostname != first_host:
                    return status, body  # not followed: the kubelet reports it as is
                if followed == MAX_REDIRECTS:
                    raise RedirectLimit(f"stopped after {MAX_REDIRECTS} redirects")
                followed += 1
                current = next_url

    async def _get_once(self, url: str, headers: Sequence[tuple[str, str]]) -> tuple[int, str | None, bytes]:
        """(status, Location, the body's first MAX_OUTPUT_BYTES) of one GET: a probe's output is its body."""
        try:
            origin = Origin.of(url)
            parts = urlsplit(url)
            request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection = await Connection.open(origin, self._tls() if origin.scheme == "https" else None, None)
            try:
                await connection.send("GET", request_target, [("Host", origin.host_header), *headers], b"")
                head = await connection.response_head(None)
                body = b""
                async for chunk in connection.body(None):
                    body += chunk
                    if len(body) >= MAX_OUTPUT_BYTES:
                        break
            finally:
                connection.close()
        except HttpError as exc:
            raise HttpGetError(describe(exc)) from exc
        location = next((v.decode("latin-1") for k, v in head.headers if k == b"location"), None)
        return head.status_code, location, body[:MAX_OUTPUT_BYTES]

    def _tls(self) -> ssl.SSLContext:
        if self._unverified is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            self._unverified = context
        return self._unverified

    async def close(self) -> None:
        """Nothing stays open between GETs; kept so owners close what they were given."""


async def http_check(getter: HttpGetter, url: str, headers: Sequence[tuple[str, str]], timeout: float) -> Outcome:
    try:
        status, body = await getter.get(url, headers, timeout)
    except TimeoutError:
        return Outcome(Result.FAILURE, f"Get {url}: timed out after {timeout:g}s")
    except (HttpGetError, OSError) as exc:
        return Outcome(Result.FAILURE, f"Get {url}: {describe(exc)}")
    result = http_result(status)
    if result is Result.FAILURE:
        return Outcome(result, f"HTTP probe failed with statuscode: {status}")
    if status >= 300:
        # The kubelet's words, which the upstream redirect spec looks for in the ProbeWarning event.
        return Outcome(result, f"Probe terminated redirects, Response body: {truncate(body)}", warning=True)
    return Outcome(result, f"HTTP {status}")


async def tcp_check(host: str, port: int, timeout: float) -> Outcome:
    address = host_port(host, port)
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Outcome(Result.FAILURE, f"dial tcp {address}: i/o timeout")
    except OSError as exc:
        return Outcome(Result.FAILURE, f"dial tcp {address}: {exc.strerror or exc}")
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Outcome(Result.SUCCESS)


async def exec_check(runtime: Any, container_id: str, command: Sequence[str], timeout: int) -> Outcome:
    """Runs `command` in the container through CRI ExecSync; exit 0 is success, a timeout a failure."""
    try:
        exit_code, stdout, stderr = await runtime.exec_sync(container_id, command, timeout)
    except RuntimeCallError as exc:
        if exc.code == "DEADLINE_EXCEEDED":
            return Outcome(Result.FAILURE, f"command {list(command)} timed out after {timeout}s")
        raise ProbeError(str(exc)) from exc
    output = truncate(stdout + stderr)
    if exit_code == 0:
        return Outcome(Result.SUCCESS, output)
    return Outcome(Result.FAILURE, output or f"command {list(command)} exited with {exit_code}")


async def grpc_check(host: str, port: int, service: str, timeout: float) -> Outcome:
    """grpc.health.v1.Health/Check on host:port; only SERVING passes. Every problem is a failure."""
    address = host_port(host, port)
    options = (("grpc.primary_user_agent", user_agent("probe")), ("grpc.enable_http_proxy", 0))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aio.insecure_channel(address, options=options) as channel:
        try:
            async with asyncio.timeout(timeout):
                await channel.channel_ready()
        except TimeoutError:
            return Outcome(Result.FAILURE, f"timeout: failed to connect service {address!r} within {timeout:g}s")
        check: Callable[..., Any] = channel.unary_unary(HEALTH_CHECK_METHOD, request_serializer=None,
                                                        response_deserializer=None)
        try:
            reply = await check(encode_health_request(service), timeout=max(deadline - loop.time(), 0.001))
        except aio.AioRpcError as err:
            if err.code() == StatusCode.UNIMPLEMENTED:
                message = "this server does not implement the grpc health protocol (grpc.health.v1.Health)"
            elif err.code() == StatusCode.DEADLINE_EXCEEDED:
                message = f"timeout: health rpc did not complete within {timeout:g}s"
            else:
                message = f"health rpc probe failed: {err.code().name}: {err.details()}"
            return Outcome(Result.FAILURE, f"error: {message}")
    try:
        status = decode_health_response(reply)
    except ValueError as exc:
        return Outcome(Result.FAILURE, f"error: undecodable health response: {exc}")
    if status != health_v1_pb2.HealthCheckResponse.SERVING:
        return Outcome(Result.FAILURE, f"service unhealthy (responded with {serving_status_name(status)!r})")
    return Outcome(Result.SUCCESS, "service healthy")


class Prober:
    """Runs a container's probe once: the right check, retried when it errors (not when it fails)."""

    def __init__(self, runtime: Any, http: HttpGetter | None = None):
        self._runtime = runtime
        self._http = http or HttpGetter()

    async def probe(self, spec: ProbeSpec, container: Mapping[str, Any], container_id: str, pod_ip: str) -> Outcome:
        """The outcome of the probe, or ProbeError after PROBE_RETRIES attempts that could not run."""
        error = ProbeError("not probed")  # the last attempt's error, once there was one
        for _ in range(PROBE_RETRIES):
            try:
                return await self._run(spec, container, container_id, pod_ip)
            except ProbeError as exc:
                error = exc
            except EdgeletError as exc:
                error = ProbeError(str(exc))
        raise error

    async def _run(self, spec: ProbeSpec, container: Mapping[str, Any], container_id: str, pod_ip: str) -> Outcome:
        action = spec.action
        if spec.handler == "exec":
            command = expand_static(action["command"], container)
            return await exec_check(self._runtime, container_id, command, spec.timeout)
        if spec.handler == "httpGet":
            url = http_url(action, container, pod_ip)
            headers = http_headers(action.get("httpHeaders"), "probe")
            return await http_check(self._http, url, headers, spec.timeout)
        # tcpSocket may name another host; grpc always asks the pod itself.
        host = (action.get("host") if spec.handler == "tcpSocket" else None) or pod_ip
        if not host:
            raise ProbeError("the pod has no IP address yet")
        if spec.handler == "tcpSocket":
            return await tcp_check(host, resolve_port(action["port"], container), spec.timeout)
        return await grpc_check(host, action["port"], action.get("service") or "", spec.timeout)

    async def close(self) -> None:
        await self._http.close()
